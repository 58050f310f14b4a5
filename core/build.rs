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
            ".phalanx.v1.Operation",
            ".phalanx.v1.Requests",
            ".phalanx.v1.RequestsBody",
            ".phalanx.v1.PrePrepare",
            ".phalanx.v1.Committed",
            ".phalanx.v1.Proposal",
            ".phalanx.v1.ExecutedRequests",
            ".phalanx.v1.Read",
            ".phalanx.v1.ReadReply",
            ".phalanx.v1.PerpetualCall",
            ".phalanx.v1.PerpetualVouch",
            ".phalanx.v1.PerpetualVote",
            ".phalanx.v1.PerpetualResult",
            // Checkpoint states (a megabyte or more) are shared, not copied, between the
            // replica's checkpoints, its storage records and state transfer.
            ".phalanx.v1.State",
            ".phalanx.v1.StableState",
        ])
        // The rare large bodies are boxed, so the hot ones (publications, votes,
        // requests) move through decoding and dispatch as 72 bytes rather than 144.
        .boxed(".phalanx.v1.Body.kind.view_change")
        .boxed(".phalanx.v1.Body.kind.state")
        .compile_fds(fds)
        .expect("generate prost code");
}
