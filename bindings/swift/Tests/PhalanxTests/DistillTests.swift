import Foundation
import XCTest
@testable import Phalanx

/// The distillation client against a deployment of real `phalanxd` processes on
/// loopback: 4 `phalanxd run` servers and a `phalanxd broker`, clients from its generated
/// directory of 16.
final class DistillTests: PhalanxdTestCase {
    override func setUpWithError() throws {
        try super.setUpWithError()
        cluster = try LocalCluster.distill(dir: dir.path, phalanxd: phalanxd, clients: 16, brokers: 1)
    }

    func testTwoClientsSubmitConcurrentlyAndServerZeroDeliversEachMessageOnce() async throws {
        try cluster.startAll()
        let messages = 4
        let clients = try (0..<2).map {
            try DistillClient(clusterFile: cluster.configPath(), index: UInt32($0), timeoutSeconds: 30)
        }
        XCTAssertEqual(clients.map { $0.index() }, [0, 1])
        XCTAssertEqual(clients.map { $0.id() }, [1 << 31, (1 << 31) + 1])

        // Each client submits its messages one after the other, both clients at once.
        let deliveries = try await withThrowingTaskGroup(of: (Int, [DistillDelivery]).self) { group in
            for (i, client) in clients.enumerated() {
                group.addTask {
                    var delivered: [DistillDelivery] = []
                    for n in 0..<messages {
                        delivered.append(try await client.submit(message: Data("client \(i) message \(n)")))
                    }
                    return (i, delivered)
                }
            }
            var byClient: [Int: [DistillDelivery]] = [:]
            for try await (i, delivered) in group { byClient[i] = delivered }
            return byClient
        }
        for (i, delivered) in deliveries {
            XCTAssertEqual(delivered.count, messages)
            XCTAssertTrue(delivered.allSatisfy { $0.height > 0 }, "client \(i): \(delivered)")
            let seqs = delivered.map(\.seq)
            XCTAssertTrue(zip(seqs, seqs.dropFirst()).allSatisfy { $0 < $1 }, "client \(i): seqs \(seqs)")
        }

        // A certified delivery means a quorum of servers delivered: server 0 may trail.
        // Once it reaches the highest height a client saw, it has delivered every message.
        let top = Double(deliveries.values.joined().map(\.height).max() ?? 0)
        let deadline = Date().addingTimeInterval(30)
        while (cluster.metric(id: 0, name: "phalanx_distill_height") ?? 0) < top && Date() < deadline {
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        let delivered = cluster.metric(id: 0, name: "phalanx_distill_messages_delivered_total")
        XCTAssertEqual(delivered, Double(clients.count * messages), "messages server 0 delivered")

        for client in clients { client.close() }
        do {
            _ = try await clients[0].submit(message: Data("after close"))
            XCTFail("a closed client submitted")
        } catch PhalanxError.Client {}
    }

    func testAnIndexBeyondTheDirectoryIsAConfigError() throws {
        XCTAssertThrowsError(try DistillClient(clusterFile: cluster.configPath(), index: 16)) { error in
            guard case PhalanxError.Config(let message) = error else {
                return XCTFail("expected .Config, got \(error)")
            }
            XCTAssertTrue(message.contains("16 clients"), message)
        }
    }
}
