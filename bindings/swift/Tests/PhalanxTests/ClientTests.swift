import Foundation
import XCTest
@testable import Phalanx

/// The async client against a PBFT cluster of real `phalanxd` processes on loopback.
final class ClientTests: PhalanxdTestCase {
    override func setUpWithError() throws {
        try super.setUpWithError()
        cluster = try LocalCluster(dir: dir.path, phalanxd: phalanxd)
        try cluster.startAll()
    }

    func testKeyValueOperationsAgainstPhalanxd() async throws {
        let client = try Client(clusterFile: cluster.configPath(), timeoutSeconds: 30)
        let file = try ClusterFile.load(path: cluster.configPath())
        XCTAssertEqual(client.id(), file.clients().first)
        XCTAssertEqual(file.replicas().count, 4)

        let k = Data("greeting")
        let put = try await client.put(key: k, value: Data("hello"))
        XCTAssertNil(put)
        let got = try await client.get(key: k)
        XCTAssertEqual(got, Data("hello"))
        let swapped = try await client.cas(key: k, expected: Data("hello"), new: Data("bonjour"))
        XCTAssertEqual(swapped, CasResult(swapped: true, before: Data("hello")))
        let kept = try await client.cas(key: k, expected: Data("hello"), new: Data("hola"))
        XCTAssertEqual(kept, CasResult(swapped: false, before: Data("bonjour")))
        // An unordered read, answered by the replicas' stores.
        let read = try await client.read(op: kvGet(key: k))
        XCTAssertEqual(try kvDecodeReply(reply: read), .value(Data("bonjour")))
        let deleted = try await client.delete(key: k)
        XCTAssertEqual(deleted, Data("bonjour"))
        let gone = try await client.get(key: k)
        XCTAssertNil(gone)

        // Concurrent requests from one client: each gets its own result.
        try await withThrowingTaskGroup(of: Data?.self) { group in
            for i in 0..<8 {
                group.addTask { try await client.put(key: Data("key-\(i)"), value: Data("\(i)")) }
            }
            for try await before in group {
                XCTAssertNil(before)
            }
        }
        for i in 0..<8 {
            let value = try await client.get(key: Data("key-\(i)"))
            XCTAssertEqual(value, Data("\(i)"))
        }

        // f = 1: one replica down, the cluster still answers.
        cluster.kill(id: 3)
        let before = try await client.put(key: k, value: Data("again"))
        XCTAssertNil(before)
        let again = try await client.get(key: k)
        XCTAssertEqual(again, Data("again"))

        client.close()
        do {
            _ = try await client.get(key: k)
            XCTFail("a closed client answered")
        } catch PhalanxError.Client {}
    }

    /// A restarted client keeps its request numbers from its write-ahead log: its first
    /// request is executed afresh, not answered from the replicas' reply cache.
    func testARestartedClientNeverReusesARequestNumber() async throws {
        let first = try Client(clusterFile: cluster.configPath(), timeoutSeconds: 30)
        let absent = try await first.put(key: Data("k"), value: Data("1"))
        XCTAssertNil(absent)
        first.close()
        let second = try Client(clusterFile: cluster.configPath(), timeoutSeconds: 30)
        let before = try await second.put(key: Data("k"), value: Data("2"))
        XCTAssertEqual(before, Data("1"))
        second.close()
    }

    func testNoQuorumIsATimeout() async throws {
        for id: UInt32 in [1, 2, 3] { cluster.kill(id: id) }
        let client = try Client(clusterFile: cluster.configPath(), timeoutSeconds: 1)
        do {
            _ = try await client.put(key: Data("k"), value: Data("v"))
            XCTFail("one replica of four answered alone")
        } catch PhalanxError.Timeout(let message) {
            XCTAssertTrue(message.contains("quorum"), message)
        }
    }
}
