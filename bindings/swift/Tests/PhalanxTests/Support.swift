import Foundation
import Phalanx
import XCTest

/// The repository's root, from this file's path (the tests run from the source tree).
let repository = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

/// A deterministic generator (SplitMix64): a failing seed reproduces.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func bytes(_ count: Int) -> Data {
        Data((0..<count).map { _ in UInt8.random(in: 0...255, using: &self) })
    }
}

extension Data {
    init(_ text: String) { self = text.data(using: .utf8)! }
}

/// A test against real `phalanxd` processes on loopback (PHALANXD names the binary;
/// scripts/test-swift builds it and sets it, and without it the test is skipped): the
/// subclass makes `cluster` in `dir`; both are gone after each test.
class PhalanxdTestCase: XCTestCase {
    var phalanxd: String!
    var dir: URL!
    var cluster: LocalCluster!

    override func setUpWithError() throws {
        guard let path = ProcessInfo.processInfo.environment["PHALANXD"], !path.isEmpty else {
            throw XCTSkip("PHALANXD is not set")
        }
        phalanxd = path
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("phalanx-swift-\(UUID())")
    }

    override func tearDownWithError() throws {
        cluster = nil  // kills its processes
        if let dir { try? FileManager.default.removeItem(at: dir) }
    }
}
