import NIOCore
import Testing

@testable import CapGate

/// Reading the provider's token counts off its answer as it streams past (SPEC §11 "Settle",
/// Proxy/UsageCapture.swift): `usage` of a JSON answer; `message_start` then the last
/// `message_delta` of a stream; cache writes split 5-minute / 1-hour; an answer whose usage is
/// not known in full is not "known" (it settles at its hold).
@Suite("Usage capture from the provider's answer")
struct UsageCaptureTests {
    static func whole(_ body: String, type: String? = "application/json") -> ProviderUsage {
        var capture = UsageCapture(contentType: type)
        capture.read(whole: ByteBuffer(string: body))
        return capture.usage
    }

    /// `body` fed in pieces of `size` bytes, then finished.
    static func streamed(_ body: String, type: String = "text/event-stream", size: Int) -> ProviderUsage {
        var capture = UsageCapture(contentType: type)
        let bytes = Array(body.utf8)
        for start in stride(from: 0, to: bytes.count, by: size) {
            capture.feed(ByteBuffer(bytes: bytes[start..<min(start + size, bytes.count)]))
        }
        capture.finish()
        return capture.usage
    }

    static let stream = [
        #"event: message_start"#,
        #"data: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":25,"cache_read_input_tokens":7,"output_tokens":1}}}"#,
        "",
        #"event: content_block_delta"#,
        #"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the \"usage\" was"}}"#,
        "",
        #"event: message_delta"#,
        #"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":42}}"#,
        "",
        #"event: message_stop"#,
        #"data: {"type":"message_stop"}"#,
        "", "",
    ]

    @Test("a JSON answer: input, output, cache writes (all 5-minute when not split) and cache reads; known")
    func jsonAnswer() {
        let usage = Self.whole(
            #"{"id":"m","content":[],"usage":{"input_tokens":100,"output_tokens":20,"cache_creation_input_tokens":30,"cache_read_input_tokens":5}}"#
        )
        #expect(usage == ProviderUsage(inputTokens: 100, outputTokens: 20, cacheWrite5m: 30, cacheWrite1h: 0, cacheRead: 5, known: true))
    }

    @Test("cache writes split by cache_creation: the 1-hour part apart, the rest 5-minute; the split alone gives the total")
    func cacheSplit() {
        let split = Self.whole(
            #"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":30,"cache_creation":{"ephemeral_5m_input_tokens":20,"ephemeral_1h_input_tokens":10}}}"#
        )
        #expect(split.cacheWrite5m == 20 && split.cacheWrite1h == 10)
        let onlySplit = Self.whole(
            #"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation":{"ephemeral_5m_input_tokens":4,"ephemeral_1h_input_tokens":6}}}"#
        )
        #expect(onlySplit.cacheWrite5m == 4 && onlySplit.cacheWrite1h == 6)
        let onlyLong = Self.whole(
            #"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":9,"cache_creation":{"ephemeral_1h_input_tokens":9}}}"#
        )
        #expect(onlyLong.cacheWrite5m == 0 && onlyLong.cacheWrite1h == 9)
    }

    @Test("not known: no usage, output or input missing, negative or fractional counts, a body that is not I-JSON")
    func unknown() {
        for body in [
            #"{"id":"m"}"#, #"{"usage":{"input_tokens":3}}"#, #"{"usage":{"output_tokens":3}}"#,
            #"{"usage":{"input_tokens":-1,"output_tokens":3}}"#, #"{"usage":{"input_tokens":1.5,"output_tokens":3}}"#,
            #"{"usage":{"input_tokens":1,"output_tokens":2},"usage":{"input_tokens":1,"output_tokens":2}}"#,
            #"{"usage":{"input_tokens":1,"output_tokens":2}} trailing"#, "",
        ] {
            #expect(!Self.whole(body).known, "\(body)")
        }
        #expect(Self.whole(#"{"usage":{"input_tokens":-1,"output_tokens":3}}"#).inputTokens == nil)
    }

    @Test("which answers are read: JSON in any case with parameters, event streams; anything else gives nothing")
    func contentTypes() {
        let body = #"{"usage":{"input_tokens":1,"output_tokens":2}}"#
        #expect(Self.whole(body, type: "Application/JSON; charset=utf-8").known)
        #expect(Self.whole(body, type: "application/vnd.api+json").known)
        #expect(Self.whole(body, type: "text/plain") == ProviderUsage(cacheWrite5m: 0, cacheWrite1h: 0, cacheRead: 0))
        #expect(!Self.whole(body, type: nil).known)
        #expect(Self.whole("data: " + body + "\n", type: "TEXT/EVENT-STREAM; charset=utf-8").inputTokens == 1)
    }

    @Test("a stream: input from message_start, output from the last message_delta, text that mentions usage ignored; known")
    func stream() {
        let usage = Self.streamed(Self.stream.joined(separator: "\n"), size: 4_096)
        #expect(usage == ProviderUsage(inputTokens: 25, outputTokens: 42, cacheWrite5m: 0, cacheWrite1h: 0, cacheRead: 7, known: true))
    }

    @Test("a stream read the same whatever its chunks: one byte at a time, odd sizes, CRLF line ends, no final newline")
    func chunking() {
        let expected = Self.streamed(Self.stream.joined(separator: "\n"), size: 4_096)
        for size in [1, 2, 7, 64, 333] {
            #expect(Self.streamed(Self.stream.joined(separator: "\n"), size: size) == expected, "\(size)")
        }
        #expect(Self.streamed(Self.stream.joined(separator: "\r\n"), size: 5) == expected)
        #expect(Self.streamed(Self.stream.prefix(8).joined(separator: "\n"), size: 3) == expected)
    }

    @Test("a stream cut before its message_delta is not known, though message_start gave both counts")
    func cutStream() {
        let usage = Self.streamed(Self.stream.prefix(6).joined(separator: "\n"), size: 100)
        #expect(usage.inputTokens == 25 && usage.outputTokens == 1 && !usage.known)
        // A message_delta without an output count does not close it either.
        let noCount = Self.stream.prefix(6) + [#"data: {"type":"message_delta","usage":{"input_tokens":25}}"#, ""]
        #expect(!Self.streamed(noCount.joined(separator: "\n"), size: 100).known)
    }

    @Test("a JSON answer fed in chunks reads as the whole; the byte search finds a needle anywhere, never past the end")
    func jsonChunks() {
        let body = #"{"usage":{"input_tokens":11,"output_tokens":22,"cache_read_input_tokens":3}}"#
        #expect(Self.streamed(body, type: "application/json", size: 3) == Self.whole(body))
        let hay = Array("ab\"usage\"".utf8)
        #expect(UsageCapture.contains(hay[...], Array("\"usage\"".utf8)))
        #expect(!UsageCapture.contains(hay[..<(hay.count - 1)], Array("\"usage\"".utf8)))
        #expect(!UsageCapture.contains(hay[2...], Array("usages".utf8)))
    }
}
