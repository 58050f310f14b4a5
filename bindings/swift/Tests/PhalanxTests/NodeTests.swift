import Foundation
import XCTest
@testable import Phalanx

final class NodeTests: XCTestCase {
    func testGeneratedClusterHasItsRoles() throws {
        let configs = try generateCluster(protocol: .pbft, f: 1, clients: 2, seed: 7)
        XCTAssertEqual(configs.count, 6)
        let info = try describeConfig(config: configs[4])
        XCTAssertEqual(info.role, .client)
        XCTAssertEqual(info.replicas, [0, 1, 2, 3])
        XCTAssertEqual(info.clients, [4, 5])
        XCTAssertEqual(roleName(role: info.role), "client")
        XCTAssertEqual(try generateCluster(protocol: .pbft, f: 1, clients: 2, seed: 7), configs, "deterministic")
        XCTAssertThrowsError(try generateCluster(protocol: .pbft, f: 1, subscribers: 1)) { error in
            guard case PhalanxError.Config = error else { return XCTFail("\(error)") }
        }
        XCTAssertThrowsError(try generateCluster(protocol: .pbft, f: 1, params: ["no_such_parameter": 1]))
    }

    func testAClientSubmitsAndPersistsItsLeaseFirst() throws {
        let configs = try generateCluster(protocol: .pbft, f: 1, clients: 1, seed: 7)
        let client = try Node(config: configs[4])
        XCTAssertEqual(client.role(), .client)
        XCTAssertEqual(client.protocol(), .pbft)
        XCTAssertEqual(client.nextRequest(), 1)
        try client.handle(now: 0, input: .submit(op: kvPut(key: Data("k"), value: Data("v"))))
        // Persist before send: the lease on request numbers comes out first, alone.
        guard case .persist(let token, _) = client.poll() else { return XCTFail("expected a persist") }
        XCTAssertNil(client.poll())
        let round = client.handleMany(inputs: [TimedInput(now: 1, input: .persisted(token: token))])
        XCTAssertEqual(round.errors, [nil])
        let sends = round.outputs.compactMap { output -> UInt32? in
            if case .send(let to, _) = output { return to } else { return nil }
        }
        XCTAssertEqual(Set(sends), [0, 1, 2, 3])
        XCTAssertNotNil(round.nextTimeout)
    }

    func testRefusalsAreHandleErrorsWithTheCoresWording() throws {
        let configs = try generateCluster(protocol: .pbft, f: 1, clients: 1, seed: 7)
        let client = try Node(config: configs[4])
        XCTAssertThrowsError(try client.handle(now: 0, input: .publish(topic: 0, payload: Data(), algorithm: .ab))) { error in
            XCTAssertEqual(error as? HandleError, .WrongRole(role: .client, request: "publish"))
            XCTAssertEqual((error as? HandleError)?.description, "a client cannot handle a publish request")
        }
        let round = client.handleMany(inputs: [
            TimedInput(now: 0, input: .subscribe(topics: [1])),
            TimedInput(now: 0, input: .timeout),
        ])
        XCTAssertEqual(round.errors, [.WrongRole(role: .client, request: "subscribe"), nil])
    }

    func testAPublicationReachesSubscribers() throws {
        let configs = try generateCluster(protocol: .pubSub, f: 1, clients: 1, subscribers: 2, topics: [3], seed: 1)
        let nodes = try configs.map { try Node(config: $0) }
        try nodes[4].handle(now: 0, input: .publish(topic: 3, payload: Data("hello"), algorithm: .bracha))
        var delivered: [UInt32: [Delivery]] = [:]
        var queue: [(from: UInt32, to: UInt32, bytes: Data)] = []
        repeat {
            if !queue.isEmpty {
                let m = queue.removeFirst()
                try nodes[Int(m.to)].handle(now: 1, input: .message(from: m.from, bytes: m.bytes))
            }
            for node in nodes {
                for output in node.drain() {
                    switch output {
                    case .send(let to, let bytes): queue.append((node.id(), to, bytes))
                    case .deliver(let d): delivered[node.id(), default: []].append(d)
                    default: break
                    }
                }
            }
        } while !queue.isEmpty
        for subscriber: UInt32 in [5, 6] {
            XCTAssertEqual(delivered[subscriber]?.map(\.payload), [Data("hello")])
            XCTAssertEqual(delivered[subscriber]?.first?.algorithm, .bracha)
        }
        XCTAssertEqual(nodes[5].stats().unsubscribed, 0)
    }

    func testABadClusterFileNamesItself() {
        XCTAssertThrowsError(try Client(clusterFile: "/nonexistent/cluster.toml")) { error in
            guard case PhalanxError.Config(let message) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(message.contains("/nonexistent/cluster.toml"), message)
        }
    }
}
