import Foundation
import NIOHTTP1
import Testing

@testable import CapGate
@testable import CapGateDev

#if canImport(Glibc)
    import Glibc
#endif

/// SPEC §9, the delivery half: signed webhooks to a real receiver on loopback, retried until
/// they arrive, once per gateway fleet, across a kill -9.
@Suite("Threshold notifications delivered as signed webhooks", .serialized, .timeLimit(.minutes(5)))
struct NotificationDeliveryTests {
    static let secret = "whsec_" + Data("capgate-test-webhook-secret-0123456789".utf8).base64EncodedString()

    static func settings(_ receiver: WebhookReceiver) -> [String: String] {
        [
            "notifications.webhookUrl": receiver.url, "notifications.webhookSecret": secret, "notifications.pollInterval": "0.2",
            "notifications.retryDelay": "0.2", "notifications.maxRetryDelay": "0.5", "notifications.timeout": "2",
        ]
    }

    /// Starts `receiver`, then a gateway configured for it (with `settings` on top) where one
    /// company on a cap of 5 makes 4 calls: one 80 % notification row, then `body`.
    static func oneCrossing(
        _ receiver: WebhookReceiver, settings: [String: String], _ body: @Sendable (Harness, UUID) async throws -> Void
    ) async throws {
        try await receiver.start()
        defer { Task { await receiver.stop() } }
        try await Harness.with(settings: Self.settings(receiver).merging(settings) { _, new in new }) { h in
            try await h.createPlan("p", company: 5, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            for _ in 0..<4 { #expect(try await h.message(key: users[0].key).status == 200) }
            #expect(try await h.scalar("SELECT count(*) FROM notifications") == 1)
            try await body(h, company)
        }
    }

    /// Polls until `condition` holds or `limit` passes; returns whether it held.
    static func eventually(within limit: Duration = .seconds(20), _ condition: () async throws -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(100))
        }
        return try await condition()
    }

    /// Verifies deliveries with the Standard Webhooks reference library for Python, as a receiver would.
    static func referenceVerify(_ deliveries: [WebhookReceiver.Delivery]) async throws {
        let file = NSTemporaryDirectory() + "capgate-webhooks-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let items = JSON.array(
            deliveries.map {
                .obj([
                    "body": .string($0.body),
                    "headers": .obj([
                        "webhook-id": .string($0.id), "webhook-timestamp": .string(String($0.timestamp)),
                        "webhook-signature": .string($0.signature),
                    ]),
                ])
            })
        try Data(items.byteBuffer().readableBytesView).write(to: URL(fileURLWithPath: file))
        let script = """
            import json, sys
            from standardwebhooks.webhooks import Webhook, WebhookVerificationError
            items = json.load(open(sys.argv[1]))
            for item in items:
                assert Webhook(sys.argv[2]).verify(item["body"], item["headers"])["id"] == item["headers"]["webhook-id"]
                try:
                    Webhook("whsec_d3Jvbmc=").verify(item["body"], item["headers"])
                    sys.exit("a wrong secret verified")
                except WebhookVerificationError:
                    pass
            print("verified", len(items))
            """
        let python = try await PythonTools.python()
        let (status, output) = try await SDKTests.run(python, ["-c", script, file, secret])
        #expect(status == 0, "\(output)")
        #expect(output.contains("verified \(deliveries.count)"), "\(output)")
    }

    @Test("each row is POSTed once with the SPEC's JSON and a Standard Webhooks signature the receiver verifies; a wrong secret does not")
    func signedPayload() async throws {
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        try await receiver.start()
        defer { Task { await receiver.stop() } }
        try await Harness.with(settings: Self.settings(receiver)) { h in
            try await h.createPlan("p", company: 10, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            for _ in 0..<10 { #expect(try await h.message(key: users[0].key).status == 200) }
            #expect(try await Self.eventually { receiver.deliveries.count == 2 })
            try await Task.sleep(for: .milliseconds(500))
            let deliveries = receiver.deliveries.sorted { ($0.json["threshold"]?.intValue ?? 0) < ($1.json["threshold"]?.intValue ?? 0) }
            #expect(deliveries.count == 2)
            #expect(deliveries.allSatisfy { $0.validSignature })
            for delivery in deliveries {
                #expect(
                    !WebhookSignature.verify(
                        id: delivery.id, timestamp: delivery.timestamp, body: Array(delivery.body.utf8), secret: "whsec_d3Jvbmc=",
                        header: delivery.signature))
                #expect(abs(delivery.timestamp - Int(Date().timeIntervalSince1970)) < 60)
                #expect(delivery.json["id"]?.stringValue == delivery.id)
            }
            let first = deliveries[0].json
            #expect(first["type"]?.stringValue == "usage.threshold")
            #expect(first["company"]?["id"]?.stringValue == company.text)
            #expect(first["company"]?["name"]?.stringValue == "Test Co")
            #expect(first["user"] == .null)
            #expect(first["scope"]?.stringValue == "company")
            #expect(first["feature"] == .null)
            #expect(first["window"]?.stringValue == "period")
            #expect(first["threshold"]?.intValue == 80)
            #expect(first["used"]?.intValue == 8)
            #expect(first["limit"]?.intValue == 10)
            #expect(first["window_start"]?.stringValue != nil && first["window_end"]?.stringValue != nil)
            #expect(deliveries[1].json["threshold"]?.intValue == 100)
            #expect(try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered' AND attempts = 1") == 2)
            // The reference verifier (the `standardwebhooks` package from PyPI) accepts every delivery.
            try await Self.referenceVerify(deliveries)
            let metrics = try await h.request(.GET, "/metrics", headers: h.asOperator).body
            // (Counters are per process, shared by the tests running in it.)
            #expect(metrics.contains("capgate_notification_attempts_total{result=\"delivered\"}"))
            #expect(metrics.contains("capgate_notifications_oldest_pending_seconds"))
        }
    }

    @Test(
        "a receiver that refuses connections, then answers 500, then comes up: every notification arrives, each webhook-id delivered, none lost"
    )
    func retriesUntilDelivered() async throws {
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        defer { Task { await receiver.stop() } }
        try await Harness.with(settings: Self.settings(receiver)) { h in
            try await h.createPlan("p", company: 10, user: 5)
            let (_, users) = try await h.createCompany(plan: "p", users: 2)
            for i in 0..<10 { #expect(try await h.message(key: users[i % 2].key).status == 200) }
            let rows = try await h.scalar("SELECT count(*) FROM notifications")
            #expect(rows == 6)  // company 80 and 100, each user 80 and 100
            // Down: connection refused, recorded and retried.
            #expect(
                try await Self.eventually {
                    try await h.scalar("SELECT count(*) FROM notifications WHERE attempts >= 2 AND last_error IS NOT NULL") == rows
                })
            #expect(try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'pending'") == rows)
            // Up, answering 500.
            receiver.answer(500)
            try await receiver.start()
            #expect(try await Self.eventually { receiver.attempts >= Int(rows) })
            #expect(try await h.text("SELECT min(last_error) FROM notifications") == "HTTP 500")
            // Then 200: everything arrives.
            receiver.answer(200)
            #expect(
                try await Self.eventually { try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == rows })
            let ids = try await h.text("SELECT string_agg(id::text, ',' ORDER BY id) FROM notifications") ?? ""
            #expect(Set(receiver.deliveries.map(\.id)) == Set(ids.split(separator: ",").map(String.init)))
            #expect(receiver.deliveries.allSatisfy { $0.validSignature })
        }
    }

    @Test("a receiver that answers 500 past notifications.retryFor: the row is marked failed, its attempts and last error kept")
    func failsAfterRetryFor() async throws {
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        receiver.answer(500)
        try await Self.oneCrossing(receiver, settings: ["notifications.retryFor": "2"]) { h, company in
            // Pending while the window lasts, failed after it: never delivered, never retried again.
            #expect(try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'pending'") == 1)
            #expect(try await Self.eventually { try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'failed'") == 1 })
            #expect(try await h.scalar("SELECT attempts FROM notifications") >= 2)
            #expect(try await h.text("SELECT last_error FROM notifications") == "HTTP 500")
            let attempts = receiver.attempts
            try await Task.sleep(for: .seconds(1))
            #expect(receiver.attempts == attempts)
            let read = try await h.op(.GET, "/admin/v1/companies/\(company.text)/notifications")
            #expect(read.json["data"]?.arrayValue?.first?["status"]?.stringValue == "failed")
            #expect(read.json["data"]?.arrayValue?.first?["last_error"]?.stringValue == "HTTP 500")
            // The company's admin reads it in general words (SPEC §9).
            let admin = try await h.createUser(company: company, role: "admin")
            let own = try await h.request(.GET, "/admin/v1/companies/\(company.text)/notifications", headers: [("x-api-key", admin.key)])
            #expect(own.json["data"]?.arrayValue?.first?["last_error"]?.stringValue == "receiver answered 500")

            // Purged after notifications.retentionDays once its window has ended; pending rows stay.
            try await BatchAdmissionTests.withMetering(h) { _, database in
                let store = NotificationStore(database: database)
                #expect(try await store.purge(olderThanDays: 90) == 0)
                try await h.exec(
                    """
                    UPDATE notifications SET created_at = now() - interval '100 days', window_end = now() - interval '1 day',
                           next_attempt_at = now() - interval '95 days'
                    """)
                #expect(try await store.purge(olderThanDays: 90) == 1)
                #expect(try await h.scalar("SELECT count(*) FROM notifications") == 0)
            }
        }
        for (recorded, general) in [
            ("HTTP 503", "receiver answered 503"), ("the provider did not answer in time", "timed out"),
            ("connection failed: connection reset by peer (errno: 104) 10.1.2.3:443", "receiver unreachable"),
        ] {
            #expect(NotificationStore.generalError(recorded) == general)
        }
    }

    @Test("a receiver that answers 200 and drips its body holds an attempt no longer than notifications.timeout; the row goes once")
    func drippingReceiver() async throws {
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        receiver.drip(every: .milliseconds(300), total: .seconds(12))
        try await Self.oneCrossing(receiver, settings: ["notifications.timeout": "1"]) { h, _ in
            let started = ContinuousClock.now
            // Delivered once the head said 200 and the body was read for at most the timeout,
            // long before the 12 s drip ends; the lease (3 × timeout + 5 s) keeps the row from
            // every other worker meanwhile.
            #expect(
                try await Self.eventually(within: .seconds(8)) {
                    try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == 1
                })
            #expect(ContinuousClock.now - started < .seconds(8))
            // Nothing is sent once it is delivered. Every attempt the receiver saw is one the row
            // counts: one on a quiet machine; on a loaded one an earlier attempt may have missed
            // the 1 s timeout before the head, then failed and been counted.
            let attempts = receiver.attempts
            try await Task.sleep(for: .seconds(1))
            #expect(receiver.attempts == attempts)
            #expect(try await h.scalar("SELECT attempts FROM notifications") == attempts)
        }
    }

    @Test("a company's webhook_url overrides the configured URL; with no URL at all rows stay pending and are sent once one is set")
    func perCompanyURL() async throws {
        let configured = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        let own = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        try await configured.start()
        try await own.start()
        defer {
            Task {
                await configured.stop()
                await own.stop()
            }
        }
        try await Harness.with(settings: Self.settings(configured)) { h in
            try await h.createPlan("p", company: 5, user: nil)
            let (first, firstUsers) = try await h.createCompany(plan: "p", users: 1)
            let (second, secondUsers) = try await h.createCompany(plan: "p", users: 1)
            let patched = try await h.op(.PATCH, "/admin/v1/companies/\(second.text)", .obj(["webhook_url": .string(own.url)]))
            #expect(patched.json["webhook_url"]?.stringValue == own.url)
            for _ in 0..<5 {
                #expect(try await h.message(key: firstUsers[0].key).status == 200)
                #expect(try await h.message(key: secondUsers[0].key).status == 200)
            }
            #expect(try await Self.eventually { try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == 4 })
            #expect(Set(configured.deliveries.compactMap { $0.json["company"]?["id"]?.stringValue }) == [first.text])
            #expect(Set(own.deliveries.compactMap { $0.json["company"]?["id"]?.stringValue }) == [second.text])
            #expect(configured.deliveries.count == 2 && own.deliveries.count == 2)
        }
        // No configured URL: rows wait, untouched, until the company gets one.
        let settings = Self.settings(configured).filter { $0.key != "notifications.webhookUrl" }
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("p", company: 5, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            for _ in 0..<5 { #expect(try await h.message(key: users[0].key).status == 200) }
            try await Task.sleep(for: .seconds(1))
            #expect(try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'pending' AND attempts = 0") == 2)
            // Rows that have nowhere to go do not age the outbox's oldest pending row; with a URL they would.
            #expect(
                try await NotificationDeliverer.outboxNumbers(
                    database: Database(client: h.db, timeout: .seconds(10), logger: TestCluster.logger), configuredURL: nil)?
                    .oldestPendingSeconds == 0)
            let aged = try await NotificationDeliverer.outboxNumbers(
                database: Database(client: h.db, timeout: .seconds(10), logger: TestCluster.logger), configuredURL: "http://127.0.0.1:1/")
            #expect((aged?.oldestPendingSeconds ?? 0) >= 1)
            let before = own.deliveries.count
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(company.text)", .obj(["webhook_url": .string(own.url)])).status == 200)
            #expect(try await Self.eventually { try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == 2 })
            #expect(own.deliveries.count == before + 2)
        }
    }

    @Test("two gateways on one database: each notification is delivered once (one POST per webhook-id)")
    func twoGatewaysDeliverOnce() async throws {
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        try await receiver.start()
        defer { Task { await receiver.stop() } }
        try await HeavyTests.alone {
            try await Harness.with(settings: Self.settings(receiver)) { first in
                try await first.createPlan("p", company: 100, user: 10)
                let (_, users) = try await first.createCompany(plan: "p", users: 20)
                try await Harness.with(database: first.databaseURL, settings: Self.settings(receiver)) { second in
                    let counts = try await ConcurrencyTests.burst(
                        first, keys: users.map(\.key), count: 200, gateways: [first.gatewayURL, second.gatewayURL])
                    #expect(counts[200] == 100)
                    let rows = try await first.scalar("SELECT count(*) FROM notifications")
                    #expect(rows >= 2)
                    #expect(
                        try await Self.eventually {
                            try await first.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == rows
                        })
                    try await Task.sleep(for: .seconds(1))
                    let perID = Dictionary(grouping: receiver.deliveries, by: \.id).mapValues(\.count)
                    #expect(perID.count == Int(rows))
                    #expect(perID.values.allSatisfy { $0 == 1 }, "\(perID.filter { $0.value > 1 })")
                    #expect(receiver.attempts == Int(rows))
                }
            }
        }
    }

    @Test("rows pending when the gateway is killed (kill -9) are delivered after it starts again")
    func survivesKill() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let receiver = WebhookReceiver(port: try WebhookReceiver.freePort(), secret: Self.secret)
        defer { Task { await receiver.stop() } }
        try await Harness.with { h in
            try await h.createPlan("p", company: 10, user: nil)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let port = try EmbeddedPostgres.freePort()
            let base = "http://127.0.0.1:\(port)"
            let environment = [
                "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port), "LOG_LEVEL": "warning",
                "OPERATOR_TOKEN": "op_notify-operator-token-for-the-tests", "SPOOL_DIRECTORY": SpoolTests.folder(),
                // The SPEC's variable names.
                "NOTIFY_WEBHOOK_URL": receiver.url, "NOTIFY_WEBHOOK_SECRET": Self.secret,
                "NOTIFICATIONS_RETRY_DELAY": "0.2", "NOTIFICATIONS_MAX_RETRY_DELAY": "0.5", "NOTIFICATIONS_POLL_INTERVAL": "0.2",
                // A lease cut short by the kill runs 3 × 2 + 5 s, inside the wait below.
                "NOTIFICATIONS_TIMEOUT": "2",
            ]
            let first = try SpoolTests.startServe(environment)
            defer { first.terminate(signal: SIGKILL) }
            try #require(try await SpoolTests.waitReady(base))
            for _ in 0..<10 { #expect(try await h.message(key: users[0].key, base: base).status == 200) }
            // The receiver is down: both rows stay pending while the gateway retries.
            #expect(try await Self.eventually { try await h.scalar("SELECT min(attempts) FROM notifications") >= 1 })
            first.terminate(signal: SIGKILL)
            await first.wait()
            #expect(try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'pending'") == 2)

            try await receiver.start()
            let second = try SpoolTests.startServe(environment)
            defer { second.terminate() }
            try #require(try await SpoolTests.waitReady(base))
            #expect(try await Self.eventually { try await h.scalar("SELECT count(*) FROM notifications WHERE status = 'delivered'") == 2 })
            #expect(Set(receiver.deliveries.map(\.id)).count == 2)
            #expect(receiver.deliveries.allSatisfy { $0.validSignature })
        }
    }
}
