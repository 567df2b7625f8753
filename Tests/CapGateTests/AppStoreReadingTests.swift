import CapGate
import Foundation
import Testing

/// SPEC §12 as amended by #47 item 2: what Apple signed is read as Apple's App Store Server
/// Library reads it. A revoked transaction is a refund; the order rule holds for the transactions
/// the app posts; `bundleId` is required; Sandbox beside Production is a start warning.
@Suite("App Store: what Apple signed, read as Apple's library reads it", .timeLimit(.minutes(5)))
struct AppStoreReadingTests {
    @Test("a transaction carrying revocationDate is a refund, never a purchase: posted, or nested in a notification")
    func revokedIsRefund() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await AppStoreTests.products(h)
            let f = AppleFixture()
            let (a, users) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(a)
            // The app posts a subscription Apple has already refunded (free → pro, before #47).
            let revoked = try f.transaction("rv1", product: "app.high.monthly", token: token, revoked: f.now - 10)
            let posted = try await h.appleTransaction(revoked, key: users[0].key)
            #expect(posted.status == 200, "\(posted.body)")
            #expect(posted.json["type"]?.stringValue != "purchase", "\(posted.body)")
            #expect(try await h.currentPeriod(a).plan == "free")
            // A notification whose type says purchase, carrying a revoked transaction.
            let nested = try f.notification(
                "SUBSCRIBED", "INITIAL_BUY", signed: f.now - 5,
                transaction: try f.transaction("rv2", product: "app.high.monthly", token: token, revoked: f.now - 10))
            let reply = try await h.appleNotification(nested)
            #expect(reply.status == 200, "\(reply.body)")
            #expect(try await h.currentPeriod(a).plan == "free")
            #expect(
                try await h.scalar("SELECT count(*) FROM billing_events WHERE company_id = '\(a.text)' AND type = 'purchase'") == 0)
        }
    }

    @Test("REFUND applied, then the purchase signed before it posted by the app: stored as stale, never restores the plan")
    func refundedPurchasePostedLate() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await AppStoreTests.products(h)
            let f = AppleFixture()
            let month = f.now + 86400 * 30

            // The purchase never reached CapGate before Apple's REFUND did.
            let (a, aUsers) = try await h.createCompany(plan: "free", users: 1)
            let aToken = try await h.appAccountToken(a)
            let purchase = try f.transaction("late1", product: "app.high.monthly", token: aToken, expires: month, signed: f.now - 300)
            let refund = try f.notification(
                "REFUND", signed: f.now - 100,
                transaction: try f.transaction(
                    "late1", product: "app.high.monthly", token: aToken, expires: month, signed: f.now - 100, revoked: f.now - 120))
            #expect(try await h.appleNotification(refund).status == 200)
            let posted = try await h.appleTransaction(purchase, key: aUsers[0].key)
            #expect(posted.status == 200, "\(posted.body)")
            #expect(posted.json["applied"]?.boolValue == false, "\(posted.body)")
            #expect(posted.json["outcome"]?.stringValue == "stale")
            #expect(try await h.currentPeriod(a).plan == "free")
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM apple_notifications WHERE transaction_id = 'late1' AND outcome = 'stale' AND notification_type = 'TRANSACTION'"
                ) == 1)
            // Posting it again stores nothing more and still applies nothing.
            #expect(try await h.appleTransaction(purchase, key: aUsers[0].key).json["outcome"]?.stringValue == "stale")
            #expect(try await h.scalar("SELECT count(*) FROM apple_notifications WHERE transaction_id = 'late1'") == 2)
            // A renewal of it signed before the refund: stale as well.
            let renewal = try f.transaction(
                "late2", original: "late1", product: "app.high.monthly", token: aToken, expires: month, signed: f.now - 200)
            #expect(try await h.appleTransaction(renewal, key: aUsers[0].key).json["outcome"]?.stringValue == "stale")
            #expect(try await h.currentPeriod(a).plan == "free")

            // The purchase applied, refunded, then posted again (StoreKit's Transaction.updates does
            // this): its first answer, and the plan stays the default.
            let (b, bUsers) = try await h.createCompany(plan: "free", users: 1)
            let bToken = try await h.appAccountToken(b)
            let bought = try f.transaction("late3", product: "app.high.monthly", token: bToken, expires: month, signed: f.now - 300)
            #expect(try await h.appleTransaction(bought, key: bUsers[0].key).json["company"]?["plan"]?.stringValue == "high")
            let refunded = try f.notification(
                "REFUND", signed: f.now - 100,
                transaction: try f.transaction(
                    "late3", product: "app.high.monthly", token: bToken, expires: month, signed: f.now - 100, revoked: f.now - 120))
            #expect(try await h.appleNotification(refunded).json["outcome"]?.stringValue == "applied")
            #expect(try await h.currentPeriod(b).plan == "free")
            #expect(try await h.appleTransaction(bought, key: bUsers[0].key).status == 200)
            #expect(try await h.currentPeriod(b).plan == "free")
        }
    }

    @Test("bundleId is required in a transaction and in a notification's data (400); renewal info carries none in Apple's payloads")
    func bundleRequired() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await AppStoreTests.products(h)
            let f = AppleFixture()
            let (a, users) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(a)
            let bare = try f.transaction("nb1", token: token, bundle: nil)
            let posted = try await h.appleTransaction(bare, key: users[0].key)
            #expect(posted.status == 400, "\(posted.body)")
            #expect(posted.json["error"]?["message"]?.stringValue?.contains("bundleId") == true, "\(posted.body)")
            #expect(try await h.appleNotification(try f.notification("SUBSCRIBED", "INITIAL_BUY", transaction: bare)).status == 400)
            #expect(try await h.appleNotification(try f.notification("TEST", bundle: nil)).status == 400)
            #expect(try await h.scalar("SELECT count(*) FROM apple_notifications") == 0)
            #expect(try await h.currentPeriod(a).plan == "free")
            // Renewal info as Apple signs it (no bundleId) is accepted.
            let withRenewal = try f.notification(
                "SUBSCRIBED", "INITIAL_BUY", transaction: try f.transaction("nb2", token: token),
                renewal: try f.renewal(original: "nb2"))
            #expect(try await h.appleNotification(withRenewal).status == 200)
            #expect(try await h.currentPeriod(a).plan == "low")
        }
    }

    @Test("accepting Sandbox beside Production logs a warning at start; Production alone does not")
    func sandboxWarning() async throws {
        for (environments, warned) in [("Production,Sandbox", 1), ("Production", 0), ("Sandbox", 0)] {
            let log = LogCapture()
            try await Harness.with(
                settings: AppleFixture.settings(environments: environments), gatewayLogger: log.logger(level: .warning)
            ) { h in
                let health = try await h.request(.GET, "/healthz")
                #expect(health.status == 200)
            }
            #expect(log.matching("accepts Sandbox beside Production").count == warned, "\(environments): \(log.all)")
        }
    }
}
