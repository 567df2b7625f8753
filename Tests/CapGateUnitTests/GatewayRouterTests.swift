import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Testing

@testable import CapGate

/// The gateway's real router (``GatewayParts``, as `capgate serve` builds it) through
/// Hummingbird's `app.test(.router)`, with a PostgreSQL client that never runs and a provider
/// that is never called: what is answered without the database, and what is answered when it
/// cannot be reached. No socket is opened.
@Suite("Gateway router (no database)", .timeLimit(.minutes(1)))
struct GatewayRouterTests {
    static let operatorToken = "op-" + String(repeating: "x", count: 40)

    /// `flags` are added to (or replace) the ones every router here has; `stores`, the read
    /// routes' and authentication's (nil: PostgreSQL's, never reached).
    static func router(flags: [String: String] = [:], stores: GatewayStores? = nil) async throws -> Router<GatewayContext> {
        // One folder for every run: these gateways never reach a database, so nothing is ever
        // spooled in it (a folder a run was left in the temporary directory per router built).
        let spool = NSTemporaryDirectory() + "capgate-router-tests"
        let configuration = try await CapGateConfiguration.load(
            flags: [
                "database.url": "postgres://capgate@127.0.0.1:9/none", "upstream.url": "http://127.0.0.1:9",
                "database.timeout": "0.2", "spool.directory": spool, "operator.token": operatorToken,
            ].merging(flags) { _, new in new },
            environment: [:], file: "/nonexistent.json")
        return try await GatewayParts(
            configuration: configuration, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), stores: stores
        )
        .router
    }

    static func errorType(_ response: TestResponse) -> String? {
        (try? JSONParser.parse(response.body))?["error"]?["type"]?.stringValue
    }

    @Test("health, the OpenAPI document and the console page need nothing; /metrics needs the operator token")
    func openRoutes() async throws {
        try await Application(router: try await Self.router()).test(.router) { client in
            #expect(try await client.execute(uri: "/healthz", method: .get).status == .ok)
            let document = try await client.execute(uri: "/openapi.yaml", method: .get)
            #expect(document.status == .ok && String(buffer: document.body).hasPrefix("openapi:"))
            #expect(try await client.execute(uri: "/console", method: .get).status == .ok)
            let metrics = try await client.execute(uri: "/metrics", method: .get)
            #expect(metrics.status == .unauthorized)
            let allowed = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(Self.operatorToken)"])
            #expect(allowed.status == .ok)
        }
    }

    @Test("no credential is 401 before anything is read; a bad operator token is 401; another method is 405")
    func credentials() async throws {
        try await Application(router: try await Self.router()).test(.router) { client in
            for (uri, method) in [("/v1/messages", HTTPRequest.Method.post), ("/v1/usage", .get), ("/admin/v1/plans", .get)] {
                let response = try await client.execute(uri: uri, method: method, body: ByteBuffer(string: "{}"))
                #expect(response.status == .unauthorized && Self.errorType(response) == "authentication_error", "\(uri)")
            }
            let wrong = try await client.execute(uri: "/admin/v1/plans", method: .get, headers: [.authorization: "Bearer wrong"])
            #expect(wrong.status == .unauthorized)
            #expect(try await client.execute(uri: "/healthz", method: .post).status == .methodNotAllowed)
        }
    }

    @Test("failed operator and metrics authentications: past 10 a second, 429 rate_limit_error with Retry-After; the right token passes")
    func failedAuthenticationsThrottled() async throws {
        // A gateway each: the two share one count per address.
        for (path, kind) in [("/admin/v1/me", "operator"), ("/metrics", "metrics")] {
            try await Application(router: try await Self.router()).test(.router) { client in
                // 25 at once take milliseconds: at most two clock seconds, so one holds more than 10.
                var statuses: [HTTPResponse.Status] = []
                var throttled: TestResponse?
                for i in 0..<25 {
                    let headers: HTTPFields = i % 5 == 4 ? [:] : [.authorization: "Bearer wrong-\(i)"]
                    let response = try await client.execute(uri: path, method: .get, headers: headers)
                    statuses.append(response.status)
                    if response.status == .tooManyRequests { throttled = response }
                }
                #expect(statuses.prefix(10).allSatisfy { $0 == .unauthorized }, "\(kind): \(statuses)")
                #expect(Set(statuses) == [.unauthorized, .tooManyRequests], "\(kind): \(statuses)")
                let refused = try #require(throttled)
                #expect(refused.headers[.retryAfter] == "1")
                #expect(Self.errorType(refused) == "rate_limit_error")
                let right = try await client.execute(uri: path, method: .get, headers: [.authorization: "Bearer \(Self.operatorToken)"])
                #expect(right.status == .ok, "\(kind)")
            }
        }
    }

    @Test("with the database unreachable: /readyz is 503 database_unreachable, an operator read 503 overloaded_error")
    func databaseAway() async throws {
        try await Application(router: try await Self.router()).test(.router) { client in
            let ready = try await client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .serviceUnavailable)
            #expect((try? JSONParser.parse(ready.body))?["status"]?.stringValue == "database_unreachable")
            let plans = try await client.execute(
                uri: "/admin/v1/plans", method: .get, headers: [.authorization: "Bearer \(Self.operatorToken)"])
            #expect(plans.status == .serviceUnavailable && Self.errorType(plans) == "overloaded_error")
        }
    }
}
