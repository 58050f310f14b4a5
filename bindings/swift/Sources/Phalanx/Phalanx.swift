// The Swift written by hand around the generated binding (Generated/phalanx.swift): short
// forms for requests, error texts, and trace replay through the Swift API.
import Foundation

extension Input {
    /// Publisher: publish `payload` on `topic`.
    public static func publish(topic: UInt64, payload: Data, algorithm: Algorithm) -> Input {
        .request(.publish(topic: topic, payload: payload, algorithm: algorithm))
    }

    /// Subscriber: replace the topic filter.
    public static func subscribe(topics: [UInt64]) -> Input {
        .request(.subscribe(topics: topics))
    }

    /// PBFT client: order `op`.
    public static func submit(op: Data) -> Input {
        .request(.submit(op: op))
    }

    /// PBFT client: evaluate the read-only `op` without ordering it.
    public static func read(op: Data) -> Input {
        .request(.read(op: op))
    }
}

extension Invocation {
    /// Waits at least `timeout` seconds, then requests an abort and waits for the agreed
    /// outcome, which may still be the reply.
    public func get(timeout: TimeInterval) throws -> Data {
        try getTimeout(seconds: timeout)
    }
}

extension HandleError: CustomStringConvertible {
    /// The core's wording, as traces record it.
    public var description: String { handleErrorMessage(error: self) }
}

extension Trace {
    /// Replays the trace through this API: `node` (by default a fresh one from the
    /// trace's configuration) is fed every recorded input with `handle` and drained with
    /// `poll` (but after a deferred record's: its round's outputs come with the round's
    /// last record); each
    /// refusal, output and next deadline must equal the recorded one. Throws
    /// `PhalanxError.Divergence` at the first difference. The summary equals
    /// `replayNative()`'s, digest included.
    public func replay(on node: Node? = nil) throws -> ReplaySummary {
        let node = try node ?? Node(config: nodeConfig())
        var summary = ReplaySummary(
            records: count(), refused: 0, outputs: 0, sends: 0, deliveries: 0, persists: 0, faults: 0,
            executes: 0, queries: 0, completions: 0, restores: 0, compactions: 0, digest: Data())
        for (index, record) in records().enumerated() {
            func diverged(_ detail: String) -> PhalanxError {
                .Divergence(record: UInt64(index), detail: detail)
            }
            var error: String? = nil
            do {
                try node.handle(now: record.now, input: record.input)
            } catch let refusal as HandleError {
                error = refusal.description
                summary.refused += 1
            }
            if error != record.error {
                throw diverged("handle: expected \(record.error ?? "Ok"), got \(error ?? "Ok")")
            }
            if record.deferred {
                guard record.outputs.isEmpty, record.nextTimeout == nil else {
                    throw diverged("a deferred record with outputs or a next timeout")
                }
                continue
            }
            var produced = 0
            while let output = node.poll() {
                guard produced < record.outputs.count else {
                    throw diverged("output \(produced): expected none (\(record.outputs.count) recorded), got \(output)")
                }
                if output != record.outputs[produced] {
                    throw diverged("output \(produced): expected \(record.outputs[produced]), got \(output)")
                }
                summary.count(output)
                produced += 1
            }
            if produced < record.outputs.count {
                throw diverged("\(record.outputs.count) outputs recorded, \(produced) produced")
            }
            summary.outputs += UInt64(produced)
            let next = node.pollTimeout()
            if next != record.nextTimeout {
                throw diverged("next timeout: expected \(String(describing: record.nextTimeout)), got \(String(describing: next))")
            }
        }
        // Every output matched its record, so the digest over the recorded ones is the
        // digest of what this replay produced.
        summary.digest = recordedDigest()
        return summary
    }
}

extension ReplaySummary {
    fileprivate mutating func count(_ output: Output) {
        switch output {
        case .send: sends += 1
        case .deliver, .delivered, .event: deliveries += 1
        case .persist: persists += 1
        case .fault: faults += 1
        case .execute: executes += 1
        case .completed: completions += 1
        case .query: queries += 1
        case .restore: restores += 1
        case .compact: compactions += 1
        }
    }
}
