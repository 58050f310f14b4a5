//! Compiles the `.proto` files with protox (pure Rust), so no system `protoc` is needed.
fn main() {
    let protos = ["proto/phalanx.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"]).expect("compile .proto files");
    prost_build::Config::new()
        .btree_map(["."])
        // Zero-copy decoding of the hot path: frame bodies, MAC tags and payloads share
        // the received buffer.
        .bytes([
            ".phalanx.v1.Frame",
            ".phalanx.v1.BundledBody",
            ".phalanx.v1.Mac",
            ".phalanx.v1.Publication",
            ".phalanx.v1.HistoryEntry",
            ".phalanx.v1.Reply",
        ])
        .compile_fds(fds)
        .expect("generate prost code");
}
