import HTTPTypes
import Hummingbird
import NIOCore
import Testing

@testable import CapGate

/// The `Idempotency-Key` rules of SPEC §2 that are decided at the HTTP edge
/// (Proxy/IdempotencyKey.swift): the header's form, the fingerprint a key is bound to, the 409
/// and 422 answers, the replayed answer, and how much of an answer is kept.
@Suite("Idempotency-Key at the edge")
struct IdempotencyKeyTests {
    static func key(_ value: [UInt8]?) throws -> String? {
        var headers = HTTPFields()
        if let value { headers.append(HTTPField(name: .idempotencyKey, lenientValue: value)) }
        return try IdempotencyKey.key(in: headers)
    }

    static func key(_ value: String) throws -> String? { try key(Array(value.utf8)) }

    static func fingerprint(_ method: String, _ target: String, _ body: String) -> String {
        UnitTestSupport.hex(IdempotencyKey.fingerprint(method: method, target: target, body: ByteBuffer(string: body)).readableBytesView)
    }

    @Test("no header or an empty one is no key; a UUID, a ULID or a hash is taken exactly as sent")
    func accepted() throws {
        #expect(try Self.key(nil) == nil)
        #expect(try Self.key("") == nil)
        for value in ["6f1c2a7e-93d4-4a55-9c61-0f3e2b1d9a10", "01HZX3K5Q8M2V7N4P6R9T1W3Y5", "sha256:ab12", "retry #2 of order/77"] {
            #expect(try Self.key(value) == value)
        }
    }

    @Test("at most 255 characters (SPEC §2): 255 pass, 256 are 400 invalid_request_error saying the limit")
    func length() throws {
        #expect(try Self.key(String(repeating: "k", count: 255))?.count == 255)
        #expect(try Self.key(String(repeating: "é", count: 255))?.count == 255)
        for value in [String(repeating: "k", count: 256), String(repeating: "é", count: 256), String(repeating: "k", count: 10_000)] {
            let error = UnitTestSupport.refusal { _ = try Self.key(value) }
            #expect(error?.status == .badRequest && error?.type == "invalid_request_error")
            #expect(error?.message == "The Idempotency-Key header is longer than 255 characters.")
        }
    }

    @Test("a control character anywhere in the key (a tab, U+0001, DEL) is 400, however short the key")
    func controls() {
        for value: [UInt8] in [[0x61, 0x09, 0x62], [0x01], [0x6B, 0x7F], [0x6B, 0x1F, 0x6B]] {
            let error = UnitTestSupport.refusal { _ = try Self.key(value) }
            #expect(error?.status == .badRequest, "\(value)")
            #expect(error?.message == "The Idempotency-Key header may not contain control characters.", "\(value)")
        }
    }

    @Test("the fingerprint is SHA-256 of method, NUL, target, NUL, SHA-256 of the body (computed apart)")
    func fingerprintValue() {
        // Python: sha256(b"POST\0/v1/messages?x=1\0" + sha256(b"{}").digest()).hexdigest()
        #expect(Self.fingerprint("POST", "/v1/messages?x=1", "{}") == "2989af97ba616d3c51e66c37c19c953c049c4ccd37356fbf35acc98299663b90")
    }

    @Test("another method, path, query or body is another request; the separators keep method and target apart")
    func fingerprintChanges() {
        let base = Self.fingerprint("POST", "/v1/messages?x=1", "{}")
        let others = [
            Self.fingerprint("PUT", "/v1/messages?x=1", "{}"), Self.fingerprint("POST", "/v1/messages?x=2", "{}"),
            Self.fingerprint("POST", "/v1/messages", "{}"), Self.fingerprint("POST", "/v1/messages?x=1", "{ }"),
            Self.fingerprint("POST", "/v1/messages?x=1", ""), Self.fingerprint("POS", "T/v1/messages?x=1", "{}"),
        ]
        #expect(Set(others + [base]).count == others.count + 1)
        #expect(Self.fingerprint("POST", "/v1/messages?x=1", "{}") == base)
        #expect(base.count == 64)
    }

    @Test("a retry of a call in flight is 409 with Retry-After 1; a success not kept is 409 naming the byte limit; another request is 422")
    func refusals() {
        let inFlight = IdempotencyKey.refusal(.idempotencyInFlight, maxKeptBytes: 1_048_576)
        #expect(inFlight?.status.code == 409 && inFlight?.type == "idempotency_conflict" && inFlight?.headers[.retryAfter] == "1")
        let notKept = IdempotencyKey.refusal(.idempotencyNotKept, maxKeptBytes: 1_048_576)
        #expect(notKept?.status.code == 409 && notKept?.headers[.retryAfter] == nil)
        #expect(notKept?.message.contains("larger than 1048576 bytes") == true)
        let reused = IdempotencyKey.refusal(.idempotencyMismatch, maxKeptBytes: 1)
        #expect(reused?.status.code == 422 && reused?.type == "idempotency_key_reused")
        for decision in [Admission.Decision.charged, .idempotencyReplay, .companyCap, .rateLimited] {
            #expect(IdempotencyKey.refusal(decision, maxKeptBytes: 1) == nil, "\(decision)")
        }
    }

    @Test("a replay is the stored status, content type and body, marked Idempotent-Replayed: true")
    func replay() {
        let answer = StoredAnswer(status: 201, contentType: "text/event-stream", body: ByteBuffer(string: "event: done\n\n"))
        let response = IdempotencyKey.replay(answer)
        #expect(response.status.code == 201)
        #expect(response.headers[.contentType] == "text/event-stream")
        #expect(response.headers[.idempotentReplayed] == "true")
        let untyped = IdempotencyKey.replay(StoredAnswer(status: 200, contentType: nil, body: ByteBuffer()))
        #expect(untyped.headers[.contentType] == nil && untyped.headers[.idempotentReplayed] == "true")
    }

    @Test("an answer is kept chunk by chunk up to the limit inclusive; one byte more and nothing is kept, for good")
    func recorder() {
        var recorder = AnswerRecorder(limit: 10)
        recorder.record(ByteBuffer(string: "hello"))
        recorder.record(ByteBuffer(string: "world"))
        #expect(recorder.bytes.map { String(buffer: $0) } == "helloworld")
        recorder.record(ByteBuffer(string: "!"))
        #expect(recorder.bytes == nil)
        recorder.record(ByteBuffer())
        #expect(recorder.bytes == nil)
        var empty = AnswerRecorder(limit: 0)
        empty.record(ByteBuffer())
        #expect(empty.bytes?.readableBytes == 0)
        empty.record(ByteBuffer(string: "x"))
        #expect(empty.bytes == nil)
    }
}
