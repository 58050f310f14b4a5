// The Swift binding's benchmark: inputs per second through Swift on the reference traces
// (tests/traces), one call per input (`handle`, then `poll` until nil) and one call per
// round (`handleMany`), against the core alone in Rust doing the same. Prints figures
// and ratios from one run; it asserts nothing. Each figure is the median run's, robust
// to a busy machine's preemptions. A run feeds a whole trace to `nodes` fresh nodes, one
// after the other, made before the clock starts (as the Node.js benchmark does): with
// one node, a short trace's run is a few calls just after the node's making, and
// measures caches the making left cold more than the boundary.
//
//   scripts/test-swift bench [repeat] [batch] [nodes]
import Foundation
import Phalanx

let arguments = CommandLine.arguments.dropFirst()
let repeats = arguments.first.flatMap { Int($0) } ?? 20
let batch = arguments.dropFirst().first.flatMap { Int($0) } ?? 64
let nodes = arguments.dropFirst(2).first.flatMap { Int($0) } ?? 8
let traces = URL(fileURLWithPath: ProcessInfo.processInfo.environment["PHALANX_REPO"] ?? ".")
    .appendingPathComponent("tests/traces")

func seconds(_ body: () throws -> Void) rethrows -> Double {
    let clock = ContinuousClock()
    let elapsed = try clock.measure(body)
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

func median(_ runs: [Double]) -> Double {
    runs.sorted()[runs.count / 2]
}

/// The median of `repeats` runs of `feed` over `nodes` fresh nodes.
func timeSwift(_ trace: Trace, _ feed: (Node) -> Void) throws -> Double {
    var runs: [Double] = []
    for _ in 0..<repeats {
        let made = try (0..<max(nodes, 1)).map { _ in try Node(config: trace.nodeConfig()) }
        runs.append(seconds { made.forEach(feed) })
    }
    return median(runs)
}

func swiftSingle(_ trace: Trace, _ inputs: [TimedInput]) throws -> Double {
    try timeSwift(trace) { node in
        for timed in inputs {
            try? node.handle(now: timed.now, input: timed.input)
            while node.poll() != nil {}
        }
    }
}

func swiftBatch(_ trace: Trace, _ inputs: [TimedInput]) throws -> Double {
    try timeSwift(trace) { node in
        var start = 0
        while start < inputs.count {
            let end = min(start + batch, inputs.count)
            _ = node.handleMany(inputs: Array(inputs[start..<end]))
            start = end
        }
    }
}

let files = try FileManager.default.contentsOfDirectory(at: traces, includingPropertiesForKeys: nil)
    .filter { $0.pathExtension == "trace" }
    .sorted { $0.path < $1.path }
guard !files.isEmpty else { fatalError("no traces in \(traces.path) (set PHALANX_REPO)") }

print("inputs/s over \(files.count) traces, median of \(repeats) runs of \(nodes) fresh nodes each, rounds of \(batch) inputs")
func rate(_ inputs: Int, _ seconds: Double) -> String {
    String(format: "%12.0f", Double(inputs) / seconds)
}
print("trace".padding(toLength: 44, withPad: " ", startingAt: 0)
    + "      inputs   rust single swift single   rust batch  swift batch")
var totals = (inputs: 0, rustSingle: 0.0, swiftSingle: 0.0, rustBatch: 0.0, swiftBatch: 0.0)
// Per-trace ratios (logs, for a geometric mean): the totals are dominated by the traces
// whose inputs are expensive (BLS), these weigh every trace alike.
var logRatios = (single: 0.0, batch: 0.0, batchVsSingle: 0.0)
for file in files {
    let trace = try Trace.load(path: file.path)
    let inputs = trace.records().map { TimedInput(now: $0.now, input: $0.input) }
    let rustSingle = median(try timeCore(trace: trace, batch: 0, nodes: UInt32(nodes), repeat: UInt32(repeats)))
    let single = try swiftSingle(trace, inputs)
    let rustBatch = median(try timeCore(trace: trace, batch: UInt32(batch), nodes: UInt32(nodes), repeat: UInt32(repeats)))
    let batched = try swiftBatch(trace, inputs)
    // Every run feeds the trace's inputs to each of its nodes.
    let fed = inputs.count * max(nodes, 1)
    totals.inputs += fed
    totals.rustSingle += rustSingle
    totals.swiftSingle += single
    totals.rustBatch += rustBatch
    totals.swiftBatch += batched
    logRatios.single += log(rustSingle / single)
    logRatios.batch += log(rustBatch / batched)
    logRatios.batchVsSingle += log(rustSingle / batched)
    print(file.lastPathComponent.padding(toLength: 44, withPad: " ", startingAt: 0)
        + String(format: "%12d", fed) + " " + rate(fed, rustSingle) + " "
        + rate(fed, single) + " " + rate(fed, rustBatch) + " " + rate(fed, batched))
}
print("all".padding(toLength: 44, withPad: " ", startingAt: 0)
    + String(format: "%12d", totals.inputs) + " " + rate(totals.inputs, totals.rustSingle) + " "
    + rate(totals.inputs, totals.swiftSingle) + " " + rate(totals.inputs, totals.rustBatch) + " "
    + rate(totals.inputs, totals.swiftBatch))
let mean = { (sum: Double) in exp(sum / Double(files.count)) }
print("ratios of inputs/s       all inputs   geometric mean over traces")
print(String(format: "swift single / rust single: %.2f×   %.2f×", totals.rustSingle / totals.swiftSingle, mean(logRatios.single)))
print(String(format: "swift batch / rust batch:   %.2f×   %.2f×", totals.rustBatch / totals.swiftBatch, mean(logRatios.batch)))
print(String(format: "swift batch / rust single:  %.2f×   %.2f×   (target ≥ 0.5×)", totals.rustSingle / totals.swiftBatch, mean(logRatios.batchVsSingle)))
