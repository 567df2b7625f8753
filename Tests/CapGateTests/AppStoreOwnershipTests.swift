import Foundation
import PostgresNIO
import Testing

@testable import CapGate

/// SPEC §12 as amended by #47 item 1: App Store purchases bound to the company that made them.
/// Each test is an attack of the fourth review, and what closes it.
@Suite("App Store: purchases bound to the company that made them", .timeLimit(.minutes(5)))
struct AppStoreOwnershipTests {
    /// `free` (default), `low`, `high` mapped to products, and `enterprise` only the operator assigns.
    static func products(_ h: Harness) async throws {
        try await AppStoreTests.products(h)
        try await h.createPlan("enterprise", company: 100_000, user: 10_000, sort: 3)
    }

    @Test("a member of company A who knows company B's id cannot re-plan B: the purchase token is no company id")
    func companyIDIsNoToken() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (a, aUsers) = try await h.createCompany(plan: "free", users: 1)
            let (b, bUsers) = try await h.createCompany(plan: "enterprise", users: 1, role: "admin")
            // Members and admins read their company's token; it is random, not the company id.
            let aUsage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", aUsers[0].key)])
            let aToken = try await h.appAccountToken(a)
            #expect(aUsage.json["app_account_token"]?.stringValue == aToken.text)
            #expect(aUsage.json["company_id"]?.stringValue == a.text)
            #expect(aToken != a)
            let bUsage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", bUsers[0].key)])
            #expect(bUsage.json["app_account_token"]?.stringValue == (try await h.appAccountToken(b)).text)

            // A's member buys in the app naming B's id: Apple's notification matches no company.
            let month = f.now + 86400 * 30
            let named = try f.transaction("x1", product: "app.low.monthly", token: b, expires: month)
            let notified = try await h.appleNotification(try f.notification("SUBSCRIBED", "INITIAL_BUY", transaction: named))
            #expect(notified.json["outcome"]?.stringValue == "unmatched", "\(notified.body)")
            #expect(try await h.currentPeriod(b).plan == "enterprise")
            // Posting it is 403, for A's member (not A's token) and for B's admin (B's id is not B's token).
            #expect(try await h.appleTransaction(named, key: aUsers[0].key).status == 403)
            #expect(try await h.appleTransaction(named, key: bUsers[0].key).status == 403)
            // A's own id is no token either.
            #expect(try await h.appleTransaction(try f.transaction("x2", token: a), key: aUsers[0].key).status == 403)
            // Then the refund that dropped B to the default plan: unmatched as well.
            let refund = try f.notification("REFUND", signed: f.now, transaction: named)
            #expect(try await h.appleNotification(refund).json["outcome"]?.stringValue == "unmatched")
            #expect(try await h.currentPeriod(b).plan == "enterprise")
            #expect(try await h.currentPeriod(a).plan == "free")
        }
    }

    @Test("a token naming B cannot move a subscription linked to A: stored as refused, listed with the reason")
    func linkedOnce() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (a, aUsers) = try await h.createCompany(plan: "free", users: 1)
            let (b, bUsers) = try await h.createCompany(plan: "free", users: 1)
            let (aToken, bToken) = (try await h.appAccountToken(a), try await h.appAccountToken(b))
            let month = f.now + 86400 * 30
            let bought = try f.transaction("s1", token: aToken, expires: month, signed: f.now - 300)
            #expect(try await h.appleTransaction(bought, key: aUsers[0].key).status == 200)
            #expect(try await h.currentPeriod(a).plan == "low")
            // A later payload of A's subscription naming B (an upgrade signed by Apple with B's token).
            let moved = try f.transaction(
                "s2", original: "s1", product: "app.high.monthly", token: bToken, purchase: f.now - 5, expires: month,
                signed: f.now - 10)
            let reply = try await h.appleNotification(
                try f.notification("DID_CHANGE_RENEWAL_PREF", "UPGRADE", uuid: "moved-1", signed: f.now - 10, transaction: moved))
            #expect(reply.json["outcome"]?.stringValue == "refused", "\(reply.body)")
            #expect(try await h.currentPeriod(a).plan == "low")
            #expect(try await h.currentPeriod(b).plan == "free")
            #expect(try await h.text("SELECT company_id::text FROM apple_transactions WHERE original_transaction_id = 's1'") == a.text)
            // B's member posting it: 403 (the subscription is A's).
            #expect(try await h.appleTransaction(moved, key: bUsers[0].key).status == 403)
            #expect(try await h.currentPeriod(b).plan == "free")
            // Listed for the operator, saying why.
            let listed = try await h.op(.GET, "/admin/v1/billing/apple/unmatched")
            let row = listed.json["data"]?.arrayValue?.first { $0["notification_uuid"]?.stringValue == "moved-1" }
            #expect(row?["outcome"]?.stringValue == "refused", "\(listed.body)")
            #expect(row?["company_id"]?.stringValue == a.text)
            #expect(row?["reason"]?.stringValue?.contains("belongs to company \(a.text)") == true, "\(listed.body)")
        }
    }

    @Test(
        "an operator-assigned enterprise plan is not replaced by a store purchase, nor cancelled or dropped by its refund; the operator's events still apply"
    )
    func operatorPlanKept() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (e, users) = try await h.createCompany(plan: "enterprise", users: 1)
            let token = try await h.appAccountToken(e)
            let month = f.now + 86400 * 30
            // Bought in the app (notification, then the app's post): stored as refused, listed.
            let cheap = try f.transaction("e1", token: token, expires: month, signed: f.now - 300)
            let notified = try await h.appleNotification(
                try f.notification("SUBSCRIBED", "INITIAL_BUY", uuid: "ent-1", signed: f.now - 300, transaction: cheap))
            #expect(notified.json["outcome"]?.stringValue == "refused", "\(notified.body)")
            let posted = try await h.appleTransaction(cheap, key: users[0].key)
            #expect(posted.status == 200, "\(posted.body)")
            #expect(posted.json["applied"]?.boolValue == false)
            #expect(posted.json["outcome"]?.stringValue == "refused")
            #expect(posted.json["reason"]?.stringValue?.contains("operator assigned") == true, "\(posted.body)")
            #expect(try await h.currentPeriod(e).plan == "enterprise")
            let listed = try await h.op(.GET, "/admin/v1/billing/apple/unmatched")
            let reasons = listed.json["data"]?.arrayValue?.compactMap { $0["reason"]?.stringValue } ?? []
            #expect(reasons.filter { $0.contains("'enterprise', which the operator assigned") }.count == 2, "\(listed.body)")
            // Its cancellation and its refund leave the operator's plan alone (auto-renew included).
            let cancel = try f.notification("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", signed: f.now - 200, transaction: cheap)
            #expect(try await h.appleNotification(cancel).json["outcome"]?.stringValue == "stored")
            let refund = try f.notification("REFUND", signed: f.now - 100, transaction: cheap)
            #expect(try await h.appleNotification(refund).json["outcome"]?.stringValue == "stored")
            #expect(try await h.currentPeriod(e).plan == "enterprise")
            #expect(try await h.currentPeriod(e).autoRenew)
            // The operator's own word applies as before (SPEC §5).
            let event = try await h.storeEvent("purchase", company: e, product: "app.high.monthly", transaction: "op-1", expiration: month)
            #expect(event.status == 201, "\(event.body)")
            #expect(try await h.currentPeriod(e).plan == "high")

            // On the default plan (even one the operator assigned), a store purchase applies.
            let (d, dUsers) = try await h.createCompany(plan: "free", users: 1)
            let bought = try f.transaction("d1", token: try await h.appAccountToken(d), expires: month)
            #expect(try await h.appleTransaction(bought, key: dUsers[0].key).json["company"]?["plan"]?.stringValue == "low")
        }
    }

    @Test("a refund of another subscription does not drop the plan; the refund of the one that set it does")
    func refundOfAnother() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (c, users) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(c)
            let month = f.now + 86400 * 30
            let first = try f.transaction("r1", token: token, expires: month, signed: f.now - 300)
            #expect(try await h.appleTransaction(first, key: users[0].key).json["company"]?["plan"]?.stringValue == "low")
            let second = try f.transaction(
                "q1", product: "app.high.monthly", token: token, purchase: f.now - 60, expires: month, signed: f.now - 250)
            #expect(try await h.appleTransaction(second, key: users[0].key).json["company"]?["plan"]?.stringValue == "high")
            // r1 refunded: it no longer sets the plan, which stays high.
            let refundFirst = try f.notification("REFUND", signed: f.now - 100, transaction: first)
            #expect(try await h.appleNotification(refundFirst).json["outcome"]?.stringValue == "stored")
            #expect(try await h.currentPeriod(c).plan == "high")
            // Its expiry too.
            let expired = try f.notification("EXPIRED", "VOLUNTARY", signed: f.now - 90, transaction: first)
            #expect(try await h.appleNotification(expired).json["outcome"]?.stringValue == "stored")
            #expect(try await h.currentPeriod(c).plan == "high")
            // q1 refunded: the default plan.
            let refundSecond = try f.notification("REFUND", signed: f.now - 80, transaction: second)
            #expect(try await h.appleNotification(refundSecond).json["outcome"]?.stringValue == "applied")
            #expect(try await h.currentPeriod(c).plan == "free")
        }
    }

    @Test(
        "rotation: 201 with a new token (operator only, audited without it); the old token then matches nothing; linked subscriptions keep applying"
    )
    func rotation() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (c, users) = try await h.createCompany(plan: "free", users: 1, role: "admin")
            let old = try await h.appAccountToken(c)
            let month = f.now + 86400 * 30
            // A subscription bought before the rotation.
            #expect(try await h.appleTransaction(try f.transaction("k1", token: old, expires: month), key: users[0].key).status == 200)

            let path = "/admin/v1/companies/\(c.text)/app-account-token"
            #expect(try await h.request(.POST, path, headers: [("x-api-key", users[0].key)]).status == 403)
            #expect(try await h.op(.POST, "/admin/v1/companies/\(UUID().text)/app-account-token").status == 404)
            let rotated = try await h.op(.POST, path)
            #expect(rotated.status == 201, "\(rotated.body)")
            let fresh = try #require(rotated.json["app_account_token"]?.stringValue.flatMap(UUID.init(uuidString:)))
            #expect(fresh != old && fresh != c)
            #expect(rotated.json["company_id"]?.stringValue == c.text)
            #expect(try await h.appAccountToken(c) == fresh)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.json["app_account_token"]?.stringValue == fresh.text)
            // Audited, never with a token in it.
            let audit = try await h.op(.GET, "/admin/v1/audit?action=company.rotate_app_account_token")
            #expect(audit.json["data"]?.arrayValue?.count == 1, "\(audit.body)")
            #expect(!audit.body.contains(old.text) && !audit.body.contains(fresh.text))

            // The old token: a new purchase is unmatched; posting one is 403.
            let stale = try f.transaction("k2", product: "app.high.monthly", token: old, expires: month)
            #expect(
                try await h.appleNotification(try f.notification("SUBSCRIBED", "INITIAL_BUY", transaction: stale)).json["outcome"]?
                    .stringValue == "unmatched")
            #expect(try await h.appleTransaction(stale, key: users[0].key).status == 403)
            #expect(try await h.currentPeriod(c).plan == "low")
            // The subscription linked before keeps applying (its renewals carry the old token).
            let renewal = try f.transaction("k3", original: "k1", token: old, purchase: month, expires: month + 86400 * 30)
            #expect(
                try await h.appleNotification(try f.notification("DID_RENEW", transaction: renewal)).json["outcome"]?.stringValue
                    == "applied")
            // The new token applies.
            let bought = try f.transaction("k4", product: "app.high.monthly", token: fresh, expires: month)
            #expect(try await h.appleTransaction(bought, key: users[0].key).json["company"]?["plan"]?.stringValue == "high")
        }
    }

    @Test(
        "migration 0023: every company gets its own random token; store periods are marked with the subscription that set them, so existing links keep working"
    )
    func migration() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("a_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        let folder = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let source = OldMigrations.folder
        for name in try FileManager.default.contentsOfDirectory(atPath: source) where name.hasSuffix(".sql") && name < "0023" {
            try FileManager.default.copyItem(atPath: source + "/" + name, toPath: folder + "/" + name)
        }
        let old = try Migrator(folder: folder)
        _ = try await CapGateRunner.withClient(url: url, logger: logger) { try await old.migrate(client: $0, logger: logger) }
        func exec(_ sql: String) async throws {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                _ = try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).collect()
            }
        }
        func run(_ sql: String) async throws -> [String] {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String.self).collect()
            }
        }
        // A bought low in the app (linked subscription 'm1', a period the rollover renewed after
        // it); B is on low by the operator.
        let (a, b) = (UUID(), UUID())
        for statement in [
            "INSERT INTO plans (id, name, is_default) VALUES ('free', 'Free', true)",
            "INSERT INTO plans (id, name, sort_order) VALUES ('low', 'Low', 1)",
            "INSERT INTO products (product_id, plan_id, interval) VALUES ('app.low.monthly', 'low', 'month')",
            "INSERT INTO companies (id, name) VALUES ('\(a.text)', 'A'), ('\(b.text)', 'B')",
            """
            INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, source)
            VALUES ('\(a.text)', 'low', now() - interval '40 days', now() - interval '10 days', now() - interval '40 days', 'purchase'),
                   ('\(a.text)', 'low', now() - interval '10 days', now() + interval '20 days', now() - interval '40 days', 'rollover'),
                   ('\(b.text)', 'low', now() - interval '10 days', now() + interval '20 days', now() - interval '10 days', 'operator')
            """,
            "INSERT INTO apple_transactions (original_transaction_id, company_id, last_applied_at) VALUES ('m1', '\(a.text)', now() - interval '40 days')",
        ] {
            try await exec(statement)
        }
        // The old migrations from 0023 to 0029 (as the last build before the baseline did), then this
        // build's: the baseline recorded, the functions applied.
        _ = try await CapGateRunner.withClient(url: url, logger: logger) {
            try await OldMigrations.withFunctions().migrate(client: $0, logger: logger)
        }
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        #expect(try await run("SELECT count(DISTINCT app_account_token)::text FROM companies") == ["2"])
        #expect(try await run("SELECT count(*)::text FROM companies WHERE app_account_token = id") == ["0"])
        #expect(
            try await run(
                "SELECT plan_origin || ' ' || coalesce(store_subscription, '-') FROM plan_periods ORDER BY company_id = '\(a.text)' DESC, started_at"
            ) == ["store m1", "store m1", "operator -"])

        // Through the gateway: A's subscription, linked before (its payloads carry A's id, the old
        // scheme), still renews and refunds; B's operator plan is not replaced.
        try await Harness.with(database: url, settings: AppleFixture.settings()) { h in
            let f = AppleFixture()
            let renewal = try f.transaction("m2", original: "m1", token: a, purchase: f.now - 60, expires: f.now + 86400 * 30)
            #expect(
                try await h.appleNotification(try f.notification("DID_RENEW", transaction: renewal)).json["outcome"]?.stringValue
                    == "applied")
            let refund = try f.notification("REFUND", signed: f.now, transaction: renewal)
            #expect(try await h.appleNotification(refund).json["outcome"]?.stringValue == "applied")
            #expect(try await h.currentPeriod(a).plan == "free")
            let bought = try f.transaction("m3", token: try await h.appAccountToken(b))
            #expect(
                try await h.appleNotification(try f.notification("SUBSCRIBED", "INITIAL_BUY", transaction: bought)).json["outcome"]?
                    .stringValue == "refused")
            #expect(try await h.currentPeriod(b).plan == "low")
        }
    }
}
