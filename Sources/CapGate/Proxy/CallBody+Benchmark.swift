import Foundation
import NIOCore

/// The body reader's throughput on given bodies, against Foundation's `JSONSerialization` on the
/// same bytes in the same process (issue #51: at least 2× it). For `capgate bench-reader`, which
/// `bench/bench.py --bodies` runs; a measurement, never a test.
package enum BodyReaderBenchmark {
    /// One reader's result on one body.
    package struct Result: Sendable {
        package var reader: String
        package var bytes: Int
        package var reads: Int
        package var seconds: Double
        package var megabytesPerSecond: Double { Double(bytes) * Double(reads) / seconds / 1_000_000 }
    }

    /// Each reader read `body` again and again for about `seconds` (after a tenth of that as
    /// warm-up): what a metered call runs (the top-level members, the rest checked), the cost
    /// bound's second pass (``JSONParser/shape(in:maxDepth:)``, only when a budget or a token
    /// window applies), a whole tree, then `JSONSerialization`, which checks less (it takes
    /// repeated names and lone surrogates).
    package static func run(body: [UInt8], seconds: Double) throws -> [Result] {
        let buffer = ByteBuffer(bytes: body)
        let data = Data(body)
        var sink = 0
        let readers: [(String, () throws -> Void)] = [
            (
                "capgate-call-body",
                { sink &+= try CallBody.read(buffer, contentType: "application/json", maxDepth: 128).json?.values.count ?? 0 }
            ),
            ("capgate-prompt-shape", { sink &+= try JSONParser.shape(in: buffer).images &+ 1 }),
            ("capgate-whole-tree", { if case .object(let fields) = try JSONParser.parse(buffer) { sink &+= fields.count } }),
            ("foundation-jsonserialization", { sink &+= (try JSONSerialization.jsonObject(with: data) as? [String: Any])?.count ?? 0 }),
        ]
        var results: [Result] = []
        for (name, read) in readers {
            _ = try measure(read, seconds: seconds / 10)
            let (reads, elapsed) = try measure(read, seconds: seconds)
            results.append(Result(reader: name, bytes: body.count, reads: reads, seconds: elapsed))
        }
        precondition(sink != 0, "the readers read nothing")
        return results
    }

    private static func measure(_ read: () throws -> Void, seconds: Double) throws -> (Int, Double) {
        let clock = ContinuousClock()
        let start = clock.now
        let end = start + .milliseconds(Int64(seconds * 1000))
        var reads = 0
        repeat {
            for _ in 0..<16 { try read() }
            reads += 16
        } while clock.now < end
        let elapsed = clock.now - start
        return (reads, Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }
}
