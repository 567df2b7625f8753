import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import CapGate

/// The edge's routing through Hummingbird's `app.test(.router)`, with an in-memory proxy in
/// place of the ``ProxyHandler``: what is forwarded and what CapGate answers itself, the error
/// envelope, request ids, 404 and 405. No database, no socket.
@Suite("Gateway routing (in memory)")
struct GatewayRoutingTests {
    /// Answers every call under the prefix with the target it was given; a target ending in
    /// `/fail` throws a caller error, `/crash` an unknown one.
    struct EchoProxy: MeteredCalls {
        struct Crash: Error {}

        func handle(_ request: Request, context: GatewayContext) async throws -> Response {
            let target = request.head.path ?? ""
            if target.hasSuffix("/fail") { throw GatewayError.invalidRequest("no such thing") }
            if target.hasSuffix("/crash") { throw Crash() }
            return Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "proxied " + target)))
        }

        /// `x-api-key: good` is the one valid credential.
        func requireCredential(_ request: Request) async throws {
            guard request.headers[.xAPIKey] == "good" else { throw GatewayError.authentication("no credential") }
        }
    }

    static func application(prefix: String = "/v1/") -> some ApplicationProtocol {
        let router = Router(context: GatewayContext.self)
        let methods = RouteMethods()
        router.add(
            middleware: GatewayMiddleware(proxy: EchoProxy(), prefix: prefix, ownPaths: ["/v1/usage", "/healthz"], methods: methods))
        router.get("/healthz") { _, _ in "healthy" }
        router.get("/v1/usage") { _, _ in "usage" }
        router.get("/admin/v1/companies") { _, _ in "companies" }
        methods.record(router)
        return Application(router: router)
    }

    static func text(_ response: TestResponse) -> String { String(buffer: response.body) }

    static func errorType(_ response: TestResponse) -> String? {
        guard let json = try? JSONParser.parse(response.body) else { return nil }
        return json["error"]?["type"]?.stringValue
    }

    @Test("calls under the prefix go to the proxy with dot segments resolved; CapGate's own paths and /admin never do")
    func forwarding() async throws {
        try await Self.application().test(.router) { client in
            let call = try await client.execute(uri: "/v1/messages?beta=true", method: .post)
            #expect(Self.text(call) == "proxied /v1/messages?beta=true")
            #expect(call.headers[.requestID]?.hasPrefix("req_") == true)
            #expect(Self.text(try await client.execute(uri: "/v1/a/../messages", method: .post)) == "proxied /v1/messages")
            #expect(Self.text(try await client.execute(uri: "/v1/usage", method: .get)) == "usage")
            #expect(Self.text(try await client.execute(uri: "/healthz", method: .get)) == "healthy")
        }
        try await Self.application(prefix: "/").test(.router) { client in
            #expect(Self.text(try await client.execute(uri: "/admin/v1/companies", method: .get)) == "companies")
            #expect(Self.text(try await client.execute(uri: "/healthz", method: .get)) == "healthy")
            #expect(Self.text(try await client.execute(uri: "/anything", method: .get)) == "proxied /anything")
            let admin = try await client.execute(uri: "/admin/v1/nothing", method: .get)
            #expect(admin.status == .notFound && Self.errorType(admin) == "not_found_error")
        }
    }

    @Test("every error is the SPEC's envelope: a caller's error as itself, an unknown one as a logged 500, never bare")
    func envelope() async throws {
        try await Self.application().test(.router) { client in
            let fail = try await client.execute(uri: "/v1/fail", method: .post)
            #expect(fail.status == .badRequest && Self.errorType(fail) == "invalid_request_error")
            let crash = try await client.execute(uri: "/v1/crash", method: .post)
            #expect(crash.status == .internalServerError && Self.errorType(crash) == "api_error")
            #expect(crash.headers[.contentType] == "application/json" && crash.headers[.requestID] != nil)
        }
    }

    @Test("404 for an unknown path; 405 with Allow for a known path and another method; TRACE 405 on any path")
    func methods() async throws {
        try await Self.application().test(.router) { client in
            let missing = try await client.execute(uri: "/nothing", method: .get)
            #expect(missing.status == .notFound && Self.errorType(missing) == "not_found_error")
            let wrong = try await client.execute(uri: "/healthz", method: .post)
            #expect(wrong.status == .methodNotAllowed && wrong.headers[.allow]?.contains("GET") == true)
            let trace = try await client.execute(uri: "/healthz", method: .trace)
            #expect(trace.status == .methodNotAllowed && Self.errorType(trace) == "invalid_request_error")
            let dotted = try await client.execute(uri: "/admin/v1/x/../companies", method: .get)
            #expect(dotted.status == .badRequest)
        }
    }

    @Test("SPEC §2's order (401 before 400): a path CapGate will not take is 401 without a valid credential, 400 with one")
    func credentialBeforePath() async throws {
        try await Self.application().test(.router) { client in
            for uri in ["/v1/../admin/v1/companies", "/v1/a%2Fb", "/v1/../../etc"] {
                for (key, status) in [(nil, HTTPResponse.Status.unauthorized), ("bad", .unauthorized), ("good", .badRequest)] {
                    let headers: HTTPFields = key.map { [.xAPIKey: $0] } ?? [:]
                    let reply = try await client.execute(uri: uri, method: .get, headers: headers)
                    #expect(reply.status == status, "\(uri) with \(key ?? "nothing"): \(reply.status)")
                }
            }
            // CapGate's own routes (public ones among them) keep their path's 400: no credential asked.
            for uri in ["/admin/v1/x/../companies", "/v1/x/../usage", "/x/../healthz"] {
                #expect(try await client.execute(uri: uri, method: .get).status == .badRequest, "\(uri)")
            }
        }
    }
}
