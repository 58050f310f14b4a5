import Foundation
import XCTest
@testable import Phalanx

final class TraceTests: XCTestCase {
    func traces() throws -> [URL] {
        let dir = repository.appendingPathComponent("tests/traces")
        let files = try FileManager.default.contentsOfDirectory(at: dir, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "trace" }
            .sorted { $0.path < $1.path }
        XCTAssertGreaterThanOrEqual(files.count, 12, "the reference traces in \(dir.path)")
        return files
    }

    /// Every reference trace replays through the Swift API exactly as the core alone
    /// replays it: every refusal, output and deadline, and the same digest.
    func testEveryTraceReplaysIdentically() throws {
        for file in try traces() {
            let trace = try Trace.load(path: file.path)
            let native = try trace.replayNative()
            let swift = try trace.replay()
            XCTAssertEqual(swift, native, file.lastPathComponent)
            XCTAssertGreaterThan(swift.outputs, 0, file.lastPathComponent)
            XCTAssertEqual(swift.digest.count, 32)
        }
    }

    /// The batch path answers each round as the recording did: the inputs up to a record
    /// its host polled after (with the deferred ones before it) in one `handleMany` give
    /// their refusals, that record's outputs and its next deadline.
    func testRoundsReplayIdentically() throws {
        for file in try traces() {
            let trace = try Trace.load(path: file.path)
            let node = try Node(config: trace.nodeConfig())
            var round: [TraceRecord] = []
            for (index, record) in trace.records().enumerated() {
                round.append(record)
                if record.deferred { continue }
                let answer = node.handleMany(inputs: round.map { TimedInput(now: $0.now, input: $0.input) })
                let context = "\(file.lastPathComponent) record \(index)"
                XCTAssertEqual(answer.errors.map { $0?.description }, round.map { $0.error }, context)
                XCTAssertEqual(answer.outputs, record.outputs, context)
                XCTAssertEqual(answer.nextTimeout, record.nextTimeout, context)
                round = []
            }
        }
    }

    func testADivergenceNamesItsRecord() throws {
        let file = try traces().first { $0.lastPathComponent == "pbft-n4f1-client.trace" }!
        let data = try Data(contentsOf: file)
        let trace = try Trace(data: data)
        XCTAssertTrue(trace.dump().contains("pbft"))
        XCTAssertFalse(trace.label().isEmpty)
        // The same inputs on a node with other keys: its first frame differs.
        let other = try Node(config: generateCluster(protocol: .pbft, f: 1, clients: 1, seed: 99)[4])
        XCTAssertThrowsError(try trace.replay(on: other)) { error in
            guard case PhalanxError.Divergence(let record, let detail) = error else { return XCTFail("\(error)") }
            XCTAssertLessThan(record, trace.count())
            XCTAssertFalse(detail.isEmpty)
        }
    }

    func testMalformedTracesAreErrors() throws {
        XCTAssertThrowsError(try Trace(data: Data([0xff, 0xff, 0xff]))) { error in
            guard case PhalanxError.Trace = error else { return XCTFail("\(error)") }
        }
        XCTAssertThrowsError(try Trace.load(path: "/nonexistent/file.trace")) { error in
            guard case PhalanxError.Io = error else { return XCTFail("\(error)") }
        }
    }
}
