import HTTPTypes
import Testing

@testable import CapGate

/// Who may read `/metrics` (SPEC §7, App/MetricsAccess.swift): the operator token or
/// `metrics.token` as a Bearer token, anyone when `metrics.public` is true; else 401.
@Suite("Metrics access")
struct MetricsAccessTests {
    static let operatorToken = "op-" + String(repeating: "o", count: 40)
    static let metricsToken = "metrics-" + String(repeating: "m", count: 20)

    static func access(_ flags: [String: String]) async throws -> MetricsAccess {
        MetricsAccess(configuration: try await CapGateConfiguration.load(flags: flags, environment: [:], file: "/nonexistent.json"))
    }

    static func refusal(_ access: MetricsAccess, _ authorization: String?) -> String? {
        var headers = HTTPFields()
        if let authorization { headers[.authorization] = authorization }
        return UnitTestSupport.refusalMessage { try access.check(headers) }
    }

    @Test("the operator token and metrics.token pass as Bearer (any case of the word, spaces around the token)")
    func tokensPass() async throws {
        let access = try await Self.access(["operator.token": Self.operatorToken, "metrics.token": Self.metricsToken])
        for authorization in [
            "Bearer \(Self.metricsToken)", "Bearer \(Self.operatorToken)", "bearer \(Self.metricsToken)", "BEARER   \(Self.metricsToken)  ",
        ] {
            #expect(Self.refusal(access, authorization) == nil, "\(authorization)")
        }
    }

    @Test("no Bearer credential is 401 saying what is needed; another token, a near miss or a Basic header is 401")
    func othersRefused() async throws {
        let access = try await Self.access(["operator.token": Self.operatorToken, "metrics.token": Self.metricsToken])
        let needed = "/metrics needs the operator token or metrics.token as 'Authorization: Bearer <token>'."
        for authorization in [nil, "Bearer", "Bearer ", "Basic \(Self.metricsToken)", Self.metricsToken] as [String?] {
            #expect(Self.refusal(access, authorization) == needed, "\(authorization ?? "none")")
        }
        for token in [String(Self.metricsToken.dropLast()), Self.metricsToken + "x", Self.metricsToken.uppercased(), "cg_key"] {
            #expect(Self.refusal(access, "Bearer \(token)") == "This token may not read /metrics.", "\(token)")
        }
    }

    @Test("metrics.public lets anyone read; with no token configured, no Bearer token passes")
    func publicOrClosed() async throws {
        let open = try await Self.access(["metrics.public": "true"])
        #expect(Self.refusal(open, nil) == nil && Self.refusal(open, "Bearer anything") == nil)
        let closed = try await Self.access([:])
        #expect(closed.tokens.isEmpty)
        #expect(Self.refusal(closed, "Bearer ") != nil && Self.refusal(closed, "Bearer x") == "This token may not read /metrics.")
    }
}
