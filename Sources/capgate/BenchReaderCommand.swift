import ArgumentParser
import CapGate
import Foundation

/// `capgate bench-reader FILE…` (hidden; `bench/bench.py --bodies` runs it): the request body
/// reader's throughput on each file against Foundation's `JSONSerialization`, one line per reader
/// and file. A measurement for BENCHMARKS.md, never a test.
struct BenchReader: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-reader", abstract: "Measure the body reader against JSONSerialization (benchmarks).",
        shouldDisplay: false)
    @Option(help: "Seconds per reader and file.") var seconds: Double = 2
    @Argument(help: "JSON bodies to read.") var files: [String]

    func run() throws {
        for file in files {
            let body = Array(try Data(contentsOf: URL(fileURLWithPath: file)))
            for result in try BodyReaderBenchmark.run(body: body, seconds: seconds) {
                print(
                    "RESULT reader=\(result.reader) bytes=\(result.bytes) reads=\(result.reads) "
                        + "mbps=\(String(format: "%.1f", result.megabytesPerSecond))")
            }
        }
    }
}
