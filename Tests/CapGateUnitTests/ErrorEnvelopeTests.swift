import HTTPTypes
import Hummingbird
import NIOCore
import Testing

@testable import CapGate

/// SPEC §3: every error body is the Anthropic envelope
/// `{"type":"error","error":{"type","message"}}` (plus `usage` where it applies), with the
/// status the table gives each `error.type` (Support/GatewayError.swift).
@Suite("Error envelope and statuses")
struct ErrorEnvelopeTests {
    @Test("the body is exactly the envelope: type error, then error.type and error.message; usage third when given")
    func envelope() {
        let plain = GatewayError.invalidRequest("Say \"why\".")
        #expect(plain.body.serialized() == #"{"type":"error","error":{"type":"invalid_request_error","message":"Say \"why\"."}}"#)
        let usage = GatewayError(.init(code: 402), "usage_cap_exceeded", "Used up.", usage: .obj(["scope": "user"]))
        #expect(
            usage.body.serialized()
                == #"{"type":"error","error":{"type":"usage_cap_exceeded","message":"Used up."},"usage":{"scope":"user"}}"#)
    }

    @Test("the response: the status, content-type application/json, the error's own fields kept, the body the envelope")
    func response() {
        let error = GatewayError(.tooManyRequests, "rate_limit_error", "Slow down.", headers: [.retryAfter: "7"])
        let response = error.makeResponse()
        #expect(response.status == .tooManyRequests)
        #expect(response.headers[.contentType] == "application/json")
        #expect(response.headers[.retryAfter] == "7")
        var typed = GatewayError.invalidRequest("x")
        typed.headers[.contentType] = "text/plain"
        #expect(typed.makeResponse().headers[values: .contentType] == ["application/json"])
    }

    @Test("each constructor has SPEC §3's status for its type")
    func statuses() {
        let cases: [(GatewayError, Int, String)] = [
            (.invalidRequest("m"), 400, "invalid_request_error"), (.authentication("m"), 401, "authentication_error"),
            (.permission(), 403, "permission_error"), (.notFound("m"), 404, "not_found_error"),
            (.tooLarge(limit: 10), 413, "request_too_large"), (.upstream("m"), 502, "upstream_error"),
            (.overloaded(), 503, "overloaded_error"), (.upstreamTimeout("m"), 504, "upstream_timeout"),
            (BodyDeadline.error, 408, "request_timeout"), (CallReader.methodRefusal(.trace), 405, "invalid_request_error"),
        ]
        for (error, status, type) in cases {
            #expect(error.status.code == status && error.type == type, "\(type)")
        }
    }

    @Test("messages a person can act on: the size limit named, the database's 503 saying nothing was forwarded")
    func messages() {
        #expect(GatewayError.tooLarge(limit: 1_048_576).message == "The request body is larger than this gateway accepts (1048576 bytes).")
        #expect(GatewayError.overloaded().message.contains("not forwarded"))
        #expect(GatewayError.permission().message == "This credential is not allowed to use this resource.")
        #expect(BodyDeadline.error.message.contains("http.bodyTimeout") && BodyDeadline.error.message.contains("nothing was charged"))
    }

    @Test("TRACE and CONNECT: 405 naming the method, Allow listing what a forwarded path takes; the 408 closes the connection")
    func methodAndTimeout() {
        for method in [HTTPRequest.Method.trace, .connect] {
            let error = CallReader.methodRefusal(method)
            #expect(error.message == "\(method.rawValue) is not allowed through the gateway.")
            #expect(error.headers[.allow] == "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        }
        #expect(BodyDeadline.error.headers[.connection] == "close")
    }

    @Test("the body written reads back to its parts with the strict reader (what an SDK shows)")
    func readBack() throws {
        let error = GatewayError.authentication("No credential: send your key\n(x-api-key).")
        let parsed = try JSONParser.parse(error.body.byteBuffer())
        #expect(parsed["type"] == .string("error"))
        #expect(parsed["error"]?["type"] == .string("authentication_error"))
        #expect(parsed["error"]?["message"] == .string("No credential: send your key\n(x-api-key)."))
        #expect(parsed["usage"] == nil)
    }
}
