import AsyncHTTPClient
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import Testing

@testable import CapGate

/// The provider is https: the gateway's own upstream client over TLS, against a NIOSSL provider
/// with certificates made in the test (``TestPKI``) and trusted through `upstream.caFile`.
@Suite("TLS to the provider and to webhook receivers", .timeLimit(.minutes(5)))
struct UpstreamTLSTests {
    static let pki = TestPKI.shared

    /// Ledger rows that stand charged == calls the provider served, and `capgate verify` is clean.
    static func expectServedEqualsCharged(_ h: Harness, served: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let charged = try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'")
        #expect(Int64(served) == charged, sourceLocation: sourceLocation)
        #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty, sourceLocation: sourceLocation)
    }

    @Test("whole and streamed answers over https arrive byte for byte and are charged; SNI carries the host name")
    func answers() async throws {
        let provider = try await TLSProvider.start(serving: Self.pki.localhost)
        defer { provider.stop() }
        let settings = ["upstream.caFile": Self.pki.caFile]
        try await Harness.with(upstreamURL: "https://localhost:\(provider.port)", settings: settings) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)

            let whole = try await h.message(key: users[0].key)
            #expect(whole.status == 200)
            #expect(whole.body == TLSProvider.message.serialized())
            #expect(whole.json["content"]?.arrayValue?.first?["text"]?.stringValue == "Hello from the mock provider.")

            // The stream arrives as the provider flushed it, event after event.
            let request = h.streamingRequest(
                key: users[0].key, headers: [], body: #"{"model":"claude-test","max_tokens":16,"stream":true,"messages":[]}"#)
            let response = try await Harness.http.execute(request, timeout: .seconds(30))
            #expect(response.status == .ok)
            #expect(response.headers.first(name: "content-type") == "text/event-stream")
            var streamed = ""
            var pieces = 0
            for try await chunk in response.body {
                streamed += String(buffer: chunk)
                pieces += 1
            }
            #expect(streamed == TLSProvider.events.joined())
            #expect(pieces > 1, "the stream came in \(pieces) piece(s)")

            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
            #expect(
                try await h.eventually(
                    "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND input_tokens = 5 AND output_tokens = 7 AND upstream_status = 200",
                    equals: 2) == 2)
            #expect(provider.served == 2)
            try await Self.expectServedEqualsCharged(h, served: provider.served)
            // Every handshake named the host (the connection may have been reused: at least one).
            #expect(!provider.serverNames.isEmpty)
            #expect(provider.serverNames.allSatisfy { $0 == "localhost" }, "\(provider.serverNames)")
        }
    }

    @Test("an https URL with an IP address: no SNI is sent (TLS forbids it), the certificate must name the address")
    func addressWithoutSNI() async throws {
        let provider = try await TLSProvider.start(serving: Self.pki.localhost)
        defer { provider.stop() }
        try await Harness.with(upstreamURL: "https://127.0.0.1:\(provider.port)", settings: ["upstream.caFile": Self.pki.caFile]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            let reply = try await h.message(key: users[0].key)
            #expect(reply.status == 200)
            #expect(reply.body == TLSProvider.message.serialized())
            #expect(provider.serverNames == [nil])
            try await Self.expectServedEqualsCharged(h, served: provider.served)
        }
        // A certificate without the address is refused for it.
        let refused = try await TLSProvider.start(serving: Self.pki.wrongName)
        defer { refused.stop() }
        let log = LogCapture()
        try await Harness.with(
            upstreamURL: "https://127.0.0.1:\(refused.port)", settings: ["upstream.caFile": Self.pki.caFile],
            gatewayLogger: log.logger(level: .warning)
        ) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 502)
            let mismatch = "certificate name mismatch: the provider's certificate is not valid for 127.0.0.1"
            #expect(log.matching(mismatch).count == 1, "\(log.all)")
            try await Self.expectServedEqualsCharged(h, served: refused.served)
        }
    }

    @Test("the reason for a refused handshake: the problem first, told apart by the presented certificate's dates")
    func reasons() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let verifyFailed = NIOSSLError.handshakeFailed(.sslError([]))
        func reason(_ error: any Error, _ validity: (Date, Date)?) -> String {
            UpstreamTLSDiagnosis.reason(
                for: error, host: "api.example.com", trustSource: "the system's trust roots",
                validity: validity.map { (notBefore: $0.0, notAfter: $0.1) }, now: now)
        }
        // NIOSSL's text for a failed chain check names CERTIFICATE_VERIFY_FAILED.
        struct VerifyFailed: Error, CustomStringConvertible {
            var description: String { "handshakeFailed(sslError([CERTIFICATE_VERIFY_FAILED]))" }
        }
        #expect(reason(VerifyFailed(), (now - 100, now - 1)).hasPrefix("certificate expired: the provider's certificate was valid until"))
        #expect(
            reason(VerifyFailed(), (now + 1, now + 100)).hasPrefix("certificate not yet valid: the provider's certificate is valid from"))
        #expect(
            reason(VerifyFailed(), (now - 1, now + 1)).hasPrefix(
                "certificate not trusted: the provider's certificate chain does not lead to a root in the system's trust roots"))
        #expect(reason(VerifyFailed(), nil).hasPrefix("certificate not trusted"))
        #expect(reason(verifyFailed, nil).hasPrefix("TLS handshake failed (handshakeFailed("))
        #expect(reason(NIOSSLError.uncleanShutdown, nil) == "TLS handshake failed (uncleanShutdown)")
    }

    enum BadCertificate: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case unknownIssuer, wrongName, expired

        var issued: TestPKI.Issued {
            switch self {
            case .unknownIssuer: UpstreamTLSTests.pki.unknownIssuer
            case .wrongName: UpstreamTLSTests.pki.wrongName
            case .expired: UpstreamTLSTests.pki.expired
            }
        }

        /// What the gateway's log line must say.
        var logged: String {
            switch self {
            case .unknownIssuer: "certificate not trusted: the provider's certificate chain does not lead to a root in upstream.caFile"
            case .wrongName: "certificate name mismatch: the provider's certificate is not valid for localhost"
            case .expired: "certificate expired: the provider's certificate was valid until"
            }
        }

        var testDescription: String { rawValue }
    }

    @Test(
        "a certificate from an unknown CA, for another name, or expired: 502 upstream_error, refunded, the log names the problem",
        arguments: BadCertificate.allCases)
    func refusedCertificates(_ bad: BadCertificate) async throws {
        let provider = try await TLSProvider.start(serving: bad.issued)
        defer { provider.stop() }
        let log = LogCapture()
        try await Harness.with(
            upstreamURL: "https://localhost:\(provider.port)", settings: ["upstream.caFile": Self.pki.caFile],
            gatewayLogger: log.logger(level: .warning)
        ) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let reply = try await h.message(key: users[0].key)
            #expect(reply.status == 502)
            #expect(reply.json["error"]?["type"]?.stringValue == "upstream_error")
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") == 1)
            #expect(provider.served == 0)
            try await Self.expectServedEqualsCharged(h, served: provider.served)

            let lines = log.matching("upstream failed")
            #expect(lines.count == 1, "\(log.all)")
            #expect(lines.first?.contains("no TLS connection to the provider: \(bad.logged)") == true, "\(lines)")
            // The key sent upstream never reaches the log.
            #expect(!log.all.joined().contains("provider-secret-key"))
            #expect(provider.serverNames.contains("localhost"))
        }
    }

    @Test("without upstream.caFile the system's roots are used: the test CA is not trusted")
    func systemRoots() async throws {
        let provider = try await TLSProvider.start(serving: Self.pki.localhost)
        defer { provider.stop() }
        let log = LogCapture()
        try await Harness.with(upstreamURL: "https://localhost:\(provider.port)", gatewayLogger: log.logger(level: .warning)) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 502)
            #expect(provider.served == 0)
            #expect(log.matching("does not lead to a root in the system's trust roots").count == 1, "\(log.all)")
            try await Self.expectServedEqualsCharged(h, served: provider.served)
        }
    }

    @Test("upstream.caFile that holds no certificate stops the start, naming the key")
    func unreadableCAFile() async throws {
        let configuration = try await CapGateConfiguration.load(
            flags: ["upstream.caFile": "/nonexistent/ca.pem"], environment: [:], file: "/nonexistent.json")
        #expect(configuration.upstream.caFile == "/nonexistent/ca.pem")
        let error = #expect(throws: ConfigurationError.self) {
            _ = try UpstreamClient(
                configuration: configuration, baseURL: "https://localhost:1", eventLoopGroup: MultiThreadedEventLoopGroup.singleton)
        }
        #expect(error?.description.contains("upstream.caFile (UPSTREAM_CA_FILE)") == true)
        let fromEnvironment = try await CapGateConfiguration.load(
            environment: ["UPSTREAM_CA_FILE": "/a.pem", "NOTIFICATIONS_CA_FILE": "/b.pem"], file: "/nonexistent.json")
        #expect(fromEnvironment.upstream.caFile == "/a.pem")
        #expect(fromEnvironment.notifications.caFile == "/b.pem")
    }

    @Test("a webhook reaches an https receiver whose certificate notifications.caFile trusts, signed, with SNI")
    func webhookOverTLS() async throws {
        let receiver = try await TLSProvider.start(serving: Self.pki.localhost)
        defer { receiver.stop() }
        let secret = "whsec_" + Data("capgate-test-webhook-secret-0123456789".utf8).base64EncodedString()
        let settings = [
            "notifications.webhookUrl": "https://localhost:\(receiver.port)/hooks/capgate", "notifications.webhookSecret": secret,
            "notifications.caFile": Self.pki.caFile, "notifications.pollInterval": "0.2", "notifications.retryDelay": "0.2",
            "notifications.timeout": "2",
        ]
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("p", company: 5, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            for _ in 0..<4 { #expect(try await h.message(key: users[0].key).status == 200) }
            #expect(try await NotificationDeliveryTests.eventually { receiver.hooks.count == 1 })
            let hook = try #require(receiver.hooks.first)
            let id = hook.headers.first(name: "webhook-id") ?? ""
            let timestamp = Int(hook.headers.first(name: "webhook-timestamp") ?? "") ?? 0
            #expect(
                WebhookSignature.verify(
                    id: id, timestamp: timestamp, body: Array(hook.body.utf8), secret: secret,
                    header: hook.headers.first(name: "webhook-signature") ?? ""))
            let json = try JSON.parse(Array(hook.body.utf8))
            #expect(json["company"]?["id"]?.stringValue == company.text)
            #expect(json["threshold"]?.intValue == 80)
            #expect(receiver.serverNames.allSatisfy { $0 == "localhost" } && !receiver.serverNames.isEmpty)
            #expect(
                try await NotificationDeliveryTests.eventually {
                    try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == 1
                })
            try await Self.expectServedEqualsCharged(h, served: h.mock.served.count)
        }
    }

    @Test(
        "upstream.caFile does not extend to webhooks: without notifications.caFile the receiver's certificate is refused, and last_error says why"
    )
    func webhookTrustIsSeparate() async throws {
        let receiver = try await TLSProvider.start(serving: Self.pki.localhost)
        defer { receiver.stop() }
        let settings = [
            "notifications.webhookUrl": "https://localhost:\(receiver.port)/hooks/capgate",
            "notifications.webhookSecret": "whsec_" + Data("capgate-test-webhook-secret-0123456789".utf8).base64EncodedString(),
            "upstream.caFile": Self.pki.caFile, "notifications.pollInterval": "0.2", "notifications.retryDelay": "0.2",
            "notifications.timeout": "2",
        ]
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("p", company: 5, user: nil)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            for _ in 0..<4 { #expect(try await h.message(key: users[0].key).status == 200) }
            #expect(
                try await NotificationDeliveryTests.eventually {
                    try await h.scalar("SELECT count(*) FROM notifications WHERE attempts > 0") == 1
                })
            let error = try await h.text("SELECT last_error FROM notifications")
            #expect(error?.contains("certificate not trusted") == true, "\(error ?? "nil")")
            #expect(receiver.hooks.isEmpty)
            try await Self.expectServedEqualsCharged(h, served: h.mock.served.count)
        }
    }
}
