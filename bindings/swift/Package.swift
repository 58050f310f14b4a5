// swift-tools-version:5.9
// The Swift binding of Phalanx: the library product `Phalanx` (uniffi-generated Swift
// over the Rust crate in this directory, plus the Swift in Sources/Phalanx), its tests,
// and the benchmark `phalanx-bench`.
//
// The Rust side is a static library built by cargo before `swift build`:
//   cargo build --manifest-path bindings/swift/Cargo.toml            # target/debug
//   cargo build --manifest-path bindings/swift/Cargo.toml --release  # target/release
// PHALANX_LIB_DIR names the directory that holds libphalanx_swift.a (by default this
// package's target/debug; scripts/test-swift sets it).
import Foundation
import PackageDescription

let libraryDirectory = ProcessInfo.processInfo.environment["PHALANX_LIB_DIR"]
    ?? Context.packageDirectory + "/target/debug"

let package = Package(
    name: "Phalanx",
    platforms: [.macOS(.v13), .iOS(.v16)],
    products: [
        .library(name: "Phalanx", targets: ["Phalanx"]),
        .executable(name: "phalanx-bench", targets: ["PhalanxBench"]),
    ],
    targets: [
        .systemLibrary(name: "phalanxFFI", path: "Sources/phalanxFFI"),
        .target(
            name: "Phalanx",
            dependencies: ["phalanxFFI"],
            linkerSettings: [.unsafeFlags(["-L", libraryDirectory])]
        ),
        .executableTarget(name: "PhalanxBench", dependencies: ["Phalanx"]),
        .testTarget(name: "PhalanxTests", dependencies: ["Phalanx"]),
    ]
)
