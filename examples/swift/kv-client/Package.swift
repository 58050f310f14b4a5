// swift-tools-version:5.9
// A key-value client of a phalanxd cluster, on the Swift binding (bindings/swift).
//   swift run --package-path examples/swift/kv-client kv-client [cluster.toml]
// See main.swift for what it does; scripts/test-swift example runs it on this machine.
import PackageDescription

let package = Package(
    name: "KvClientExample",
    platforms: [.macOS(.v13), .iOS(.v16)],
    dependencies: [.package(path: "../../../bindings/swift")],
    targets: [
        .executableTarget(
            name: "kv-client",
            dependencies: [.product(name: "Phalanx", package: "swift")],
            path: "Sources/KvClient"
        )
    ]
)
