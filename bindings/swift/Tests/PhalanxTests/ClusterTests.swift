import Foundation
import XCTest
@testable import Phalanx

/// A Swift application: an append-only log. Each result is the op's position and the
/// op; the snapshot is the log, length-prefixed.
final class LogApplication: Application, @unchecked Sendable {
    private(set) var log: [Data] = []
    private(set) var batches: [UInt64] = []
    private(set) var restored = 0

    func execute(seq: UInt64, ops: [OrderedOperation]) -> [Data] {
        batches.append(seq)
        return ops.map { op in
            log.append(op.op)
            return Data("\(log.count - 1):") + op.op
        }
    }

    func snapshot() -> Data {
        var out = Data()
        for entry in log {
            withUnsafeBytes(of: UInt32(entry.count).littleEndian) { out.append(contentsOf: $0) }
            out.append(entry)
        }
        return out
    }

    func restore(seq: UInt64, snapshot: Data) throws {
        var log: [Data] = []
        var rest = snapshot[...]
        while !rest.isEmpty {
            guard rest.count >= 4 else { throw ApplicationError.Rejected(reason: "truncated length") }
            let length = rest.prefix(4).enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
            rest = rest.dropFirst(4)
            guard rest.count >= length else { throw ApplicationError.Rejected(reason: "truncated entry") }
            log.append(Data(rest.prefix(length)))
            rest = rest.dropFirst(length)
        }
        self.log = log
        restored += 1
    }

    func query(op: Data) -> Data? {
        Data("\(log.count)")
    }
}

/// Four replicas whose application is Swift, and a client, in one process: the network is
/// a queue (which can lose a replica's messages), storage is the host loop's, the clock
/// jumps to the next deadline when nothing is in flight.
final class InProcessCluster {
    let replicas: [HostLoop]
    let apps: [LogApplication]
    let client: HostLoop
    var now: UInt64 = 0
    var network: [(from: UInt32, to: UInt32, bytes: Data)] = []
    var completed: [UInt64: Data] = [:]
    var faults: [Output] = []
    /// Replicas whose messages, in and out, are lost.
    var silent: Set<UInt32> = []

    init(checkpointInterval: UInt64) throws {
        let configs = try generateCluster(
            protocol: .pbft, f: 1, clients: 1, seed: 11, params: ["checkpoint_interval": checkpointInterval])
        let apps = (0..<4).map { _ in LogApplication() }
        replicas = try (0..<4).map { try HostLoop(config: configs[$0], application: apps[$0]) }
        self.apps = apps
        client = try HostLoop(config: configs[4])
    }

    var nodes: [HostLoop] { replicas + [client] }

    /// Delivers messages and fires deadlines until `done` holds (or a step bound is hit).
    func run(until done: () -> Bool) throws {
        for _ in 0..<200_000 {
            for node in nodes {
                for output in try node.drain(now: now) {
                    switch output {
                    case .send(let to, let bytes):
                        if !silent.contains(node.id()) && !silent.contains(to) {
                            network.append((node.id(), to, bytes))
                        }
                    case .completed(let request, let result): completed[request] = result
                    case .fault: faults.append(output)
                    default: break
                    }
                }
            }
            if done() { return }
            if network.isEmpty {
                guard let next = nodes.compactMap({ $0.pollTimeout() }).min() else { return }
                now = max(now, next)
                for node in nodes where (node.pollTimeout() ?? .max) <= now {
                    try node.handle(now: now, input: .timeout)
                }
            } else {
                let m = network.removeFirst()
                try nodes[Int(m.to)].handle(now: now, input: .message(from: m.from, bytes: m.bytes))
            }
        }
        XCTFail("the cluster did not get there")
    }
}

final class ClusterTests: XCTestCase {
    /// Ordered operations execute once each, in one order, at every replica; the client
    /// gets each result; checkpoints take the Swift snapshots; all with one replica lost.
    func testFourReplicasWithASwiftApplicationOrderAndAgree() throws {
        let cluster = try InProcessCluster(checkpointInterval: 8)
        cluster.silent = [3]
        var expected: [UInt64: Data] = [:]
        for i in 0..<30 {
            let request = cluster.client.nextRequest()!
            let op = Data("op-\(i)")
            try cluster.client.handle(now: cluster.now, input: .submit(op: op))
            try cluster.run { cluster.completed[request] != nil }
            expected[request] = Data("\(i):") + op
        }
        XCTAssertEqual(cluster.completed, expected)
        let log = (0..<30).map { Data("op-\($0)") }
        for app in cluster.apps.prefix(3) {
            XCTAssertEqual(app.log, log)
            XCTAssertEqual(app.batches, Array(1...UInt64(app.batches.count)), "batches in order, each once")
        }
        XCTAssertTrue(cluster.apps[3].log.isEmpty)
        XCTAssertTrue(cluster.faults.isEmpty, "\(cluster.faults)")
        let status = cluster.replicas[0].status()
        XCTAssertEqual(status.executed, UInt64(cluster.apps[0].batches.count))
        XCTAssertGreaterThan(status.stable, 0, "a checkpoint over the Swift snapshots became stable")

        // The lost replica comes back and catches up through state transfer: it restores
        // a Swift snapshot, then executes the rest, and agrees.
        cluster.silent = []
        for i in 30..<50 {
            let request = cluster.client.nextRequest()!
            try cluster.client.handle(now: cluster.now, input: .submit(op: Data("op-\(i)")))
            try cluster.run { cluster.completed[request] != nil }
        }
        try cluster.run { cluster.apps[3].log.count == 50 }
        XCTAssertGreaterThan(cluster.apps[3].restored, 0)
        XCTAssertEqual(Set(cluster.apps.map(\.log)).count, 1, "every replica holds the same log")
    }

    /// A read is answered by the Swift application's `query`, without ordering.
    func testReadsAreAnsweredByTheApplication() throws {
        let cluster = try InProcessCluster(checkpointInterval: 64)
        let write = cluster.client.nextRequest()!
        try cluster.client.handle(now: 0, input: .submit(op: Data("x")))
        try cluster.run { cluster.completed[write] != nil }
        let batches = cluster.apps[0].batches.count
        let read = cluster.client.nextRequest()!
        try cluster.client.handle(now: cluster.now, input: .read(op: Data("how many?")))
        try cluster.run { cluster.completed[read] != nil }
        XCTAssertEqual(cluster.completed[read], Data("1"))
        XCTAssertEqual(cluster.apps[0].batches.count, batches, "the read was not ordered")
    }
}
