import Hummingbird
import Logging
import NIOCore
import Testing

@testable import CapGate

/// The HTTP edge's own parts (App/GatewayEdge.swift, Proxy/ProviderRoutes.swift): request ids,
/// any error as SPEC §3's envelope with its status, the bounded `route` label of logs and
/// metrics, and how a database failure is classed (fail closed: 503).
@Suite("Gateway edge: request ids, error mapping, route labels")
struct GatewayEdgeTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    static func envelope(_ error: any Error) -> (status: Int, type: String?, message: String?) {
        let response = GatewayEdge.errorResponse(error, logger: logger)
        #expect(response.headers[.contentType] == "application/json")
        let body = (error as? GatewayError)?.body
        return (response.status.code, body?["error"]?["type"]?.stringValue, body?["error"]?["message"]?.stringValue)
    }

    @Test("a request id is req_ and 24 lower-case hex digits; the first 8 are the process's tag; 10,000 in a row differ")
    func requestIDs() {
        let ids = (0..<10_000).map { _ in GatewayEdge.newRequestID() }
        let hex = Set("0123456789abcdef")
        for id in ids.prefix(100) {
            #expect(id.hasPrefix("req_") && id.count == 28 && id.dropFirst(4).allSatisfy(hex.contains), "\(id)")
        }
        #expect(Set(ids).count == ids.count)
        #expect(Set(ids.map { $0.prefix(12) }).count == 1)
    }

    @Test("the scrambler is SplitMix64's finaliser: its published first output for seed 0, 0 kept, distinct inputs distinct")
    func mix() {
        #expect(GatewayEdge.mix(0x9e37_79b9_7f4a_7c15) == 0xe220_a839_7b1d_cdaf)
        #expect(GatewayEdge.mix(0) == 0)
        #expect(Set((0..<4_096).map { GatewayEdge.mix(UInt64($0)) }).count == 4_096)
        #expect(GatewayEdge.hex(255, digits: 4) == "00ff" && GatewayEdge.hex(.max, digits: 8) == "ffffffffffffffff")
        #expect(GatewayEdge.hex(0, digits: 16) == String(repeating: "0", count: 16))
    }

    @Test("latencies in logs: milliseconds with two decimals, rounded to the nearest hundredth")
    func millis() {
        #expect(GatewayEdge.millis(0) == "0.00")
        #expect(GatewayEdge.millis(1.234) == "1.23")
        #expect(GatewayEdge.millis(1.236) == "1.24")
        #expect(GatewayEdge.millis(12.3) == "12.30")
        #expect(GatewayEdge.millis(0.07) == "0.07")
        #expect(GatewayEdge.millis(.milliseconds(1_500)) == "1500.00")
        #expect(GatewayEdge.millis(.microseconds(2_346)) == "2.35")
    }

    @Test("any error is the envelope: a GatewayError as itself; the database's unavailability 503, a constraint 409, a bug 500 api_error")
    func errorMapping() {
        let own = Self.envelope(GatewayError.permission())
        #expect(own.status == 403 && own.type == "permission_error")
        let cases: [(any Error, Int)] = [
            (DatabaseError.unavailable, 503), (DatabaseError.constraint(sqlState: "23505", constraint: "plans_pkey", detail: nil), 409),
            (DatabaseError.other("XX000"), 500), (CancellationError(), 500), (HTTPError(.notFound), 404),
            (HTTPError(.methodNotAllowed), 405),
            (HTTPError(.contentTooLarge), 413), (HTTPError(.badRequest, message: "bad"), 400), (HTTPError(.unauthorized), 401),
            (HTTPError(.forbidden), 403), (HTTPError(.unprocessableContent), 422),
        ]
        for (error, status) in cases {
            let response = GatewayEdge.errorResponse(error, logger: Self.logger)
            #expect(response.status.code == status, "\(error)")
            #expect(response.headers[.contentType] == "application/json", "\(error)")
        }
    }

    @Test("a database failure is classed: its own errors kept, a cancellation, a closed channel or anything unknown is unavailable (503)")
    func databaseErrors() {
        func kind(_ error: any Error) -> String {
            switch DatabaseError.map(error, logger: Self.logger) {
            case .unavailable: "unavailable"
            case .constraint(let state, _, _): "constraint \(state)"
            case .other(let state): "other \(state)"
            }
        }
        #expect(kind(DatabaseError.constraint(sqlState: "23505", constraint: nil, detail: nil)) == "constraint 23505")
        #expect(kind(DatabaseError.other("42P01")) == "other 42P01")
        #expect(kind(CancellationError()) == "unavailable")
        #expect(kind(ChannelError.ioOnClosedChannel) == "unavailable")
        #expect(kind(GatewayError.invalidRequest("x")) == "unavailable")
    }

    @Test("route labels: the provider's known routes with {id} for one segment, anything else 'proxied'; CapGate's own by pattern")
    func routeLabels() {
        let cases: [(String, String)] = [
            ("/v1/messages", "/v1/messages"), ("/v1/messages/count_tokens", "/v1/messages/count_tokens"),
            ("/v1/messages/batches/msgbatch_01", "/v1/messages/batches/{id}"),
            ("/v1/messages/batches/msgbatch_01/results", "/v1/messages/batches/{id}/results"), ("/v1/models/claude-x", "/v1/models/{id}"),
            ("/v1/files/file_1/content", "/v1/files/{id}/content"), ("/v1/messages/x", "proxied"), ("/v1/unknown", "proxied"),
            ("/v1/files/a/b/c/d/e", "proxied"), ("/v2/messages", "proxied"),
        ]
        for (path, label) in cases {
            #expect(GatewayEdge.routeLabel(path: path, proxied: true, endpoint: nil) == label, "\(path)")
        }
        #expect(
            GatewayEdge.routeLabel(path: "/x", proxied: false, endpoint: "/admin/v1/companies/{id}/usage")
                == "/admin/v1/companies/{id}/usage")
        #expect(GatewayEdge.routeLabel(path: "/x", proxied: false, endpoint: "healthz") == "/healthz")
        for endpoint in [nil, "", "NotFound"] as [String?] {
            #expect(GatewayEdge.routeLabel(path: "/nothing/here", proxied: false, endpoint: endpoint) == "unmatched")
        }
    }
}
