import Foundation
import XCTest
@testable import Phalanx

/// An amount or a balance on the wire: i64, little-endian (the native ledger's format).
func amount(_ value: Int64) -> Data {
    withUnsafeBytes(of: value.littleEndian) { Data($0) }
}

func value(_ bytes: Data) -> Int64 {
    bytes.count == 8 ? bytes.enumerated().reduce(0) { $0 | Int64($1.element) << (8 * $1.offset) } : .min
}

/// What a service's program reports to the test, from the member's service thread.
final class Told<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T?

    func set(_ v: T) { lock.withLock { value = v } }
    var get: T? { lock.withLock { value } }

    /// Waits (up to a minute) until the program reported.
    func wait(_ what: String) throws -> T {
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let v = get { return v }
            Thread.sleep(forTimeInterval: 0.02)
        }
        throw PhalanxError.Timeout(message: "\(what) did not finish within a minute")
    }
}

/// A service with no state of its own.
class Stateless: PerpetualService, @unchecked Sendable {
    func run(group: PerpetualGroup) throws {}
    func snapshot() -> Data { Data() }
    func restore(state: Data) throws {}
}

/// A caller: ten calls in flight whose outcomes it takes newest first, then two more
/// whose outcomes it takes in completion order.
final class Fanout: Stateless, @unchecked Sendable {
    let told = Told<([Int64], Set<Int64>)>()

    override func run(group: PerpetualGroup) throws {
        let calls = try (1...10).map { try group.invoke(target: 1, op: amount(Int64($0))) }
        var newestFirst: [Int64] = []
        for call in calls.reversed() {
            do {
                newestFirst.append(value(try call.get()))
            } catch CallError.Aborted {
                newestFirst.append(-1)
            }
        }
        _ = try group.invoke(target: 1, op: amount(11))
        _ = try group.invoke(target: 1, op: amount(12))
        var last = Set<Int64>()
        for _ in 0..<2 {
            if let reply = try group.nextResult().reply { last.insert(value(reply)) }
        }
        told.set((newestFirst, last))
    }
}

/// A target that serves asynchronously: it takes two requests, then answers the second
/// before the first, each with its op squared.
final class SquaresInPairs: Stateless, @unchecked Sendable {
    override func run(group: PerpetualGroup) throws {
        while true {
            let first = try group.nextRequest()
            let second = try group.nextRequest()
            for request in [second, first] {
                let x = value(request.op)
                group.sendResult(request: request, result: amount(x * x))
            }
        }
    }
}

/// A target that never answers "stall" and answers anything else with "pong".
final class Staller: Stateless, @unchecked Sendable {
    override func run(group: PerpetualGroup) throws {
        while true {
            let request = try group.nextRequest()
            if request.op != Data("stall") { group.sendResult(request: request, result: Data("pong")) }
        }
    }
}

/// A caller whose calls to a stalled target end in agreed aborts, three ways, and whose
/// next call still gets its reply.
final class Impatient: Stateless, @unchecked Sendable {
    let told = Told<[String]>()

    override func run(group: PerpetualGroup) throws {
        var seen: [String] = []
        func outcome(_ get: () throws -> Data) throws -> String {
            do {
                return String(decoding: try get(), as: UTF8.self)
            } catch CallError.Aborted(let call) {
                return "aborted \(call)"
            }
        }
        let timedOut = try group.invoke(target: 1, op: Data("stall"))
        seen.append(try outcome { try timedOut.get(timeout: 0.2) })
        let cancelled = try group.invoke(target: 1, op: Data("stall"))
        cancelled.cancel()
        seen.append(try outcome { try cancelled.get() })
        _ = try group.invokeWith(target: 1, op: Data("stall"), abortAfterSeconds: 0.1)
        let byPolicy = try group.nextResult()
        seen.append(byPolicy.reply == nil ? "aborted \(byPolicy.call)" : "replied \(byPolicy.call)")
        seen.append(try outcome { try group.invokeAndWait(target: 1, op: Data("ping")) })
        seen.append("\(group.undecided().count) undecided")
        told.set(seen)
    }
}

/// The seed's workload from Swift: `ops` increments, then as many decrements, one call at
/// a time; every member of the replicated bank records the balances the group agreed.
final class SwiftBank: Stateless, @unchecked Sendable {
    let ops: Int
    let told = Told<[Int64]>()

    init(ops: Int) { self.ops = ops }

    override func run(group: PerpetualGroup) throws {
        var balances: [Int64] = []
        for i in 0..<(2 * ops) {
            balances.append(value(try group.invokeAndWait(target: 1, op: amount(i < ops ? 1 : -1))))
        }
        told.set(balances)
    }
}

/// A ledger in Swift: adds each op to its balance and answers the new balance; its
/// snapshot is the balance, which `restore` takes back.
final class SwiftLedger: PerpetualService, @unchecked Sendable {
    private let lock = NSLock()
    private var balance: Int64 = 0
    private(set) var restores = 0

    var state: (balance: Int64, restores: Int) { lock.withLock { (balance, restores) } }

    func run(group: PerpetualGroup) throws {
        while true {
            let request = try group.nextRequest()
            let now = lock.withLock {
                balance &+= value(request.op)
                return balance
            }
            group.sendResult(request: request, result: amount(now))
        }
    }

    func snapshot() -> Data { lock.withLock { amount(balance) } }

    func restore(state: Data) throws {
        guard state.count == 8 else { throw ApplicationError.Rejected(reason: "a ledger's state is 8 bytes") }
        lock.withLock {
            balance = value(state)
            restores += 1
        }
    }
}

/// A caller that adds 1, `total` times, one call at a time, counting its replies.
final class Incrementer: Stateless, @unchecked Sendable {
    let total: Int
    private let lock = NSLock()
    private var replies = 0

    init(total: Int) { self.total = total }

    var done: Int { lock.withLock { replies } }

    override func run(group: PerpetualGroup) throws {
        while done < total {
            _ = try group.invokeAndWait(target: 1, op: amount(1))
            lock.withLock { replies += 1 }
        }
    }
}

/// Members of Perpetual groups hosted in this process, with services written in Swift,
/// over loopback with phalanxd's own networking and storage.
final class PerpetualTests: XCTestCase {
    var dir: URL!
    var members: [PerpetualMember] = []

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("phalanx-swift-perpetual-\(UUID())")
    }

    override func tearDownWithError() throws {
        for member in members { try member.stop() }
        members = []
        try? FileManager.default.removeItem(at: dir)
    }

    func start(_ groups: [UInt32], realCrypto: Bool = false, services: (UInt32) -> PerpetualService?) throws {
        let file = try keygenPerpetual(dir: dir.path, groups: groups, realCrypto: realCrypto)
        let total = groups.reduce(0, +)
        members = try (0..<total).map { try PerpetualMember(clusterFile: file, id: $0, service: services($0)) }
    }

    func testASwiftCallerTakesOutcomesInAnyOrderFromAnAsynchronousReplicatedTarget() throws {
        let fanout = Fanout()
        try start([1, 4]) { $0 == 0 ? fanout : SquaresInPairs() }
        XCTAssertEqual(members.map { $0.group() }, [0, 1, 1, 1, 1])
        let (newestFirst, last) = try fanout.told.wait("the caller")
        XCTAssertEqual(newestFirst, (1...10).reversed().map { Int64($0 * $0) })
        XCTAssertEqual(last, [121, 144])
    }

    func testTimeoutsCancelsAndPoliciesEndInAgreedAbortsAndTheNextCallIsAnswered() throws {
        let caller = Impatient()
        try start([1, 1]) { $0 == 0 ? caller : Staller() }
        XCTAssertEqual(try caller.told.wait("the caller"), ["aborted 1", "aborted 2", "aborted 3", "pong", "0 undecided"])
    }

    /// Four Swift bank members call four native ledger members (the cluster file's
    /// service), real crypto: every bank member sees the same replies, ending at 0.
    func testAReplicatedSwiftBankEndsAtZeroThroughANativeReplicatedLedger() throws {
        let ops = 25
        let banks = (0..<4).map { _ in SwiftBank(ops: ops) }
        try start([4, 4], realCrypto: true) { $0 < 4 ? banks[Int($0)] : nil }
        let expected = (1...ops).map(Int64.init) + (0..<ops).reversed().map(Int64.init)
        for (i, bank) in banks.enumerated() {
            XCTAssertEqual(try bank.told.wait("bank member \(i)"), expected, "bank member \(i)")
        }
    }

    /// A member of the target group is stopped while its group serves calls, after it
    /// took part in a checkpoint (every 128 batches, a call a batch here); restarted with a
    /// fresh Swift ledger, it takes its last stable checkpoint's Swift snapshot from its own
    /// storage through `restore`, catches up, and ends at the balance the others reached.
    func testARestartedMemberRestoresItsSwiftStateFromACheckpointAndCatchesUp() throws {
        let total = 300
        let caller = Incrementer(total: total)
        var ledgers = (0..<4).map { _ in SwiftLedger() }
        try start([1, 4]) { $0 == 0 ? caller as PerpetualService : ledgers[Int($0) - 1] }
        let file = dir.appendingPathComponent("cluster.toml").path
        func waitFor(_ what: String, _ done: () -> Bool) throws {
            let deadline = Date().addingTimeInterval(60)
            while !done() {
                guard Date() < deadline else { throw PhalanxError.Timeout(message: "\(what) within a minute") }
                Thread.sleep(forTimeInterval: 0.02)
            }
        }
        // More than half an interval past the checkpoint at 128: every member certified it.
        try waitFor("200 calls") { caller.done >= 200 }
        try members[4].stop()
        XCTAssertEqual(ledgers[3].state.restores, 0)
        ledgers[3] = SwiftLedger()
        members[4] = try PerpetualMember(clusterFile: file, id: 4, service: ledgers[3])
        try waitFor("all calls") { caller.done == total }
        try waitFor("the restarted member at balance \(total)") { ledgers[3].state.balance == Int64(total) }
        XCTAssertGreaterThan(ledgers[3].state.restores, 0, "it restored a checkpoint's Swift snapshot")
        XCTAssertEqual(ledgers.map(\.state.balance), Array(repeating: Int64(total), count: 4))
    }

    func testAnIdOutsideEveryGroupIsAConfigError() throws {
        let file = try keygenPerpetual(dir: dir.path, groups: [1, 1])
        XCTAssertThrowsError(try PerpetualMember(clusterFile: file, id: 2, service: nil)) { error in
            guard case PhalanxError.Config(let message) = error else {
                return XCTFail("expected .Config, got \(error)")
            }
            XCTAssertTrue(message.contains("node 2 is not a member"), message)
        }
    }
}
