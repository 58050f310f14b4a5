import Foundation
import XCTest
@testable import Phalanx

/// Bytes from the network, or from any file, never crash the binding: random and
/// mutated frames are dropped (as faults), bad configurations, traces and results are
/// errors.
final class RandomBytesTests: XCTestCase {
    func testRandomFramesAreFaultsAtEveryRole() throws {
        var random = SplitMix64(state: 2026)
        let clusters = [
            try generateCluster(protocol: .pubSub, f: 1, clients: 1, subscribers: 1, seed: 3),
            try generateCluster(protocol: .pbft, f: 1, clients: 1, seed: 3),
        ]
        for configs in clusters {
            for config in configs {
                let node = try Node(config: config)
                for _ in 0..<300 {
                    let from = UInt32.random(in: 0..<UInt32(configs.count + 2), using: &random)
                    let bytes = random.bytes(Int.random(in: 0..<600, using: &random))
                    try node.handle(now: 0, input: .message(from: from, bytes: bytes))
                }
                let inputs = (0..<300).map { _ in
                    TimedInput(now: 1, input: .message(from: 0, bytes: random.bytes(Int.random(in: 0..<64, using: &random))))
                }
                let round = node.handleMany(inputs: inputs)
                XCTAssertEqual(round.errors, Array(repeating: nil, count: inputs.count))
                for output in node.drain() + round.outputs {
                    guard case .fault = output else { return XCTFail("\(node.role()): \(output)") }
                }
            }
        }
    }

    /// Real frames with a byte flipped, cut short or grown: each is dropped as a fault at
    /// its receiver, or (a change outside what the MAC covers) taken as the one genuine
    /// request; nothing forged gets in.
    func testMutatedFramesAreFaults() throws {
        var random = SplitMix64(state: 7)
        let configs = try generateCluster(protocol: .pbft, f: 1, clients: 1, seed: 5)
        let client = try Node(config: configs[4])
        try client.handle(now: 0, input: .submit(op: kvPut(key: Data("k"), value: Data("v"))))
        guard case .persist(let token, _) = client.poll() else { return XCTFail("expected a persist") }
        try client.handle(now: 0, input: .persisted(token: token))
        let frames = client.drain().compactMap { output -> (UInt32, Data)? in
            if case .send(let to, let bytes) = output { return (to, bytes) } else { return nil }
        }
        XCTAssertEqual(frames.count, 4)
        for (to, frame) in frames {
            let replica = try Node(config: configs[Int(to)])
            for _ in 0..<200 {
                var bytes = frame
                switch Int.random(in: 0..<3, using: &random) {
                case 0: bytes[Int.random(in: 0..<bytes.count, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
                case 1: bytes = bytes.prefix(Int.random(in: 0..<bytes.count, using: &random))
                default: bytes.append(random.bytes(Int.random(in: 1..<16, using: &random)))
                }
                try replica.handle(now: 0, input: .message(from: 4, bytes: bytes))
                for output in replica.drain() {
                    // A replica's first input also sends its catch-up asks to the other replicas.
                    if case .send(let to, _) = output, to != 4 { continue }
                    // The primary, taking the genuine request with nothing in flight, proposes
                    // it at once: its proposal's record is persisted before anything is sent.
                    if case .persist = output, to == 0 { continue }
                    guard case .fault(let node, _) = output else { return XCTFail("\(output)") }
                    XCTAssertEqual(node, 4)
                }
            }
            XCTAssertLessThanOrEqual(replica.status().pendingRequests, 1)
        }
    }

    func testRandomConfigurationsTracesAndResultsAreErrors() {
        var random = SplitMix64(state: 11)
        for length in [0, 1, 7, 64, 1000] {
            let bytes = random.bytes(length)
            XCTAssertThrowsError(try Node(config: bytes))
            XCTAssertThrowsError(try HostLoop(config: bytes))
            XCTAssertThrowsError(try describeConfig(config: bytes))
            XCTAssertThrowsError(try Trace(data: bytes + Data([0xff])))
            _ = try? kvDecodeReply(reply: bytes)
            let store = KvStore()
            _ = store.execute(op: bytes)
            XCTAssertEqual(store.count(), 0)
            XCTAssertThrowsError(try store.restore(snapshot: Data([1]) + bytes))
        }
    }
}
