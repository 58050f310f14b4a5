// A key-value client of a phalanxd cluster: put, get, compare-and-swap, an unordered read
// and a delete, each awaited, each result agreed by a quorum of replicas.
//
//   kv-client CLUSTER.toml   a running cluster (phalanxd keygen, then phalanxd run per replica)
//   kv-client                starts a local 4-replica cluster of `phalanxd` (from $PHALANXD,
//                            or on PATH) in a temporary directory, and stops it at the end
import Foundation
import Phalanx

func text(_ value: Data?) -> String {
    value.map { String(decoding: $0, as: UTF8.self) } ?? "(absent)"
}

var localCluster: LocalCluster? = nil
var localDirectory: URL? = nil
let clusterFile: String
if let path = CommandLine.arguments.dropFirst().first {
    clusterFile = path
} else {
    let phalanxd = ProcessInfo.processInfo.environment["PHALANXD"] ?? "phalanxd"
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("phalanx-kv-example-\(getpid())")
    print("starting 4 phalanxd replicas in \(dir.path)")
    let cluster = try LocalCluster(dir: dir.path, phalanxd: phalanxd)
    try cluster.startAll()
    localCluster = cluster
    localDirectory = dir
    clusterFile = cluster.configPath()
}

let client = try Client(clusterFile: clusterFile)
print("client \(client.id()) of \(clusterFile)")
let key = Data("greeting".utf8)
print("put greeting = hello      -> before: \(text(try await client.put(key: key, value: Data("hello".utf8))))")
print("get greeting              -> \(text(try await client.get(key: key)))")
let swap = try await client.cas(key: key, expected: Data("hello".utf8), new: Data("bonjour".utf8))
print("cas hello -> bonjour      -> swapped: \(swap.swapped), before: \(text(swap.before))")
if case .value(let value) = try kvDecodeReply(reply: await client.read(op: kvGet(key: key))) {
    print("read greeting (unordered) -> \(text(value))")
}
print("delete greeting           -> before: \(text(try await client.delete(key: key)))")
client.close()
localCluster = nil  // stops the replicas
if let dir = localDirectory { try? FileManager.default.removeItem(at: dir) }
