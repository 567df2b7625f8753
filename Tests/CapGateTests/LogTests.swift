import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import CapGate

#if canImport(Glibc)
    import Glibc
#endif

@Suite("Log lines", .timeLimit(.minutes(5)))
struct LogTests {
    static func event(_ level: Logger.Level, _ message: Logger.Message, _ metadata: Logger.Metadata? = nil) -> LogEvent {
        LogEvent(level: level, message: message, metadata: metadata, source: nil, file: #fileID, function: #function, line: #line)
    }

    @Test("the log timestamp matches Foundation's calendar over four centuries, with milliseconds")
    func timestamps() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20_000 {
            // Whole seconds between 1800 and 2200: Foundation's text with ".000" added.
            let seconds = Double(Int64.random(in: -5_364_662_400...7_258_118_400, using: &generator))
            let date = Date(timeIntervalSince1970: seconds)
            var bytes: [UInt8] = []
            Timestamp.appendMilliseconds(date, to: &bytes)
            let expected = String(Timestamp.format(date).dropLast()) + ".000Z"
            #expect(String(decoding: bytes, as: UTF8.self) == expected)
            if String(decoding: bytes, as: UTF8.self) != expected { break }
        }
        for (seconds, text) in [
            (0.0, "1970-01-01T00:00:00.000Z"), (951_782_400.5, "2000-02-29T00:00:00.500Z"),
            (1_795_405_897.276, "2026-11-23T03:51:37.276Z"), (-0.001, "1969-12-31T23:59:59.999Z"),
            (4_107_542_399.999, "2100-02-28T23:59:59.999Z"),
        ] {
            var bytes: [UInt8] = []
            Timestamp.appendMilliseconds(Date(timeIntervalSince1970: seconds), to: &bytes)
            #expect(String(decoding: bytes, as: UTF8.self) == text)
        }
    }

    @Test("a line: time, level, message, then the metadata sorted by key, quoted and escaped only where needed")
    func line() {
        let bytes = LogfmtHandler.line(
            event: Self.event(
                .info, "request",
                ["status": .stringConvertible(200), "route": "/v1/messages", "note": "a \"quoted\" = value\nnext", "empty": ""]),
            metadata: ["request_id": "req_1", "route": "overridden"], at: Date(timeIntervalSince1970: 0.25))
        #expect(
            String(decoding: bytes, as: UTF8.self)
                == "time=1970-01-01T00:00:00.250Z level=info msg=request empty=\"\" note=\"a \\\"quoted\\\" = value\\nnext\" "
                + "request_id=req_1 route=/v1/messages status=200\n")
    }

    @Test(
        "not running, a line is written at once; running, gathered info lines reach the output without a flush, a warning comes after them in order at once, and the lines left at shutdown are written"
    )
    func output() async throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer {
            close(ends[0])
            close(ends[1])
        }
        _ = fcntl(ends[0], F_SETFL, fcntl(ends[0], F_GETFL) | O_NONBLOCK)
        let output = LogOutput(descriptor: ends[1])
        /// What the pipe holds once it ends with `suffix`, or after 5 s.
        func read(until suffix: String) async throws -> String {
            var received: [UInt8] = []
            let deadline = ContinuousClock.now + .seconds(5)
            var chunk = [UInt8](repeating: 0, count: 4096)
            while !String(decoding: received, as: UTF8.self).hasSuffix(suffix) && ContinuousClock.now < deadline {
                let count = chunk.withUnsafeMutableBytes { Glibc.read(ends[0], $0.baseAddress, $0.count) }
                if count > 0 { received += chunk[..<count] } else { try await Task.sleep(for: .milliseconds(1)) }
            }
            return String(decoding: received, as: UTF8.self)
        }

        output.write(Array("before\n".utf8), immediately: false)
        #expect(try await read(until: "before\n") == "before\n")

        let group = ServiceGroup(configuration: .init(services: [output], logger: Logger(label: "log-tests")))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            while !output.isGathering { try await Task.sleep(for: .milliseconds(1)) }

            for i in 0..<100 { output.write(Array("info \(i)\n".utf8), immediately: false) }
            #expect(try await read(until: "info 99\n") == (0..<100).map { "info \($0)\n" }.joined())

            output.write(Array("info last\n".utf8), immediately: false)
            output.write(Array("warning\n".utf8), immediately: true)
            #expect(try await read(until: "warning\n") == "info last\nwarning\n")

            output.write(Array("at shutdown\n".utf8), immediately: false)
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        #expect(try await read(until: "at shutdown\n") == "at shutdown\n")
        #expect(!output.isGathering)
        output.write(Array("after\n".utf8), immediately: false)
        #expect(try await read(until: "after\n") == "after\n")
    }
}
