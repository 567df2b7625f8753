import HTTPTypes
import Hummingbird
import NIOCore
import Testing

@testable import CapGate

/// What a metered call's head alone decides, before a byte of its body is read (SPEC §2,
/// Proxy/CallReader+Head.swift): `TRACE` and `CONNECT` are 405, a request `Content-Encoding`
/// other than `identity` is 415, in that order; more than one Content-Type field is 400.
@Suite("A call's head: 405, 415 and one Content-Type")
struct CallHeadTests {
    static func request(_ method: HTTPRequest.Method = .post, _ fields: [(HTTPField.Name, String)] = []) -> Request {
        var headers = HTTPFields()
        for (name, value) in fields { headers.append(HTTPField(name: name, value: value)) }
        let head = HTTPRequest(method: method, scheme: "http", authority: "gateway", path: "/v1/messages", headerFields: headers)
        return Request(head: head, body: RequestBody(buffer: ByteBuffer(string: "{}")))
    }

    static func headRefusal(_ request: Request) -> GatewayError? { UnitTestSupport.refusal { try CallReader.checkHead(request) } }

    @Test("TRACE and CONNECT are 405 on a forwarded path, before any Content-Encoding is looked at")
    func methods() {
        for method in [HTTPRequest.Method.trace, .connect] {
            let error = Self.headRefusal(Self.request(method, [(.contentEncoding, "gzip")]))
            #expect(error?.status == .methodNotAllowed && error?.type == "invalid_request_error", "\(method)")
        }
        for method in [HTTPRequest.Method.get, .head, .post, .put, .patch, .delete, .options] {
            #expect(Self.headRefusal(Self.request(method)) == nil, "\(method)")
        }
    }

    @Test("Content-Encoding: identity in any case, or empty list items, passes; any other coding is 415 naming it")
    func encodings() {
        for value in ["identity", "Identity", " IDENTITY ", ", ,identity", "identity,identity"] {
            #expect(Self.headRefusal(Self.request(.post, [(.contentEncoding, value)])) == nil, "\(value)")
        }
        let cases: [(String, String)] = [("gzip", "gzip"), ("identity, gzip", "gzip"), ("br", "br"), ("x-custom", "x-custom")]
        for (value, named) in cases {
            let error = Self.headRefusal(Self.request(.post, [(.contentEncoding, value)]))
            #expect(error?.status == .unsupportedMediaType && error?.type == "invalid_request_error", "\(value)")
            #expect(error?.message == "Content-Encoding '\(named)' is not accepted: send the request body uncompressed.", "\(value)")
        }
    }

    @Test("every Content-Encoding field counts, and a long coding name is cut to 40 characters in the answer")
    func severalFields() {
        let error = Self.headRefusal(Self.request(.post, [(.contentEncoding, "identity"), (.contentEncoding, "deflate")]))
        #expect(error?.message.contains("'deflate'") == true)
        let long = String(repeating: "z", count: 100)
        let cut = Self.headRefusal(Self.request(.post, [(.contentEncoding, long)]))
        #expect(
            cut?.message == "Content-Encoding '\(String(repeating: "z", count: 40))' is not accepted: send the request body uncompressed.")
    }

    @Test("one Content-Type field or none passes; two are 400, whatever they say")
    func contentTypes() {
        func refusal(_ fields: [(HTTPField.Name, String)]) -> GatewayError? {
            UnitTestSupport.refusal { try CallReader.checkContentType(Self.request(.post, fields)) }
        }
        #expect(refusal([]) == nil && refusal([(.contentType, "application/json")]) == nil)
        let twice = refusal([(.contentType, "application/json"), (.contentType, "application/json")])
        #expect(twice?.status == .badRequest && twice?.message == "The request has more than one Content-Type field; send one.")
        #expect(refusal([(.contentType, "text/plain"), (.contentType, "application/json")]) != nil)
    }
}
