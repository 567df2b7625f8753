import CapGate
import Crypto
import Foundation
import SwiftASN1
import Testing
import X509

/// SPEC §12 through the real gateway and PostgreSQL, with a test App Store PKI made in the tests.
@Suite("App Store: signed notifications and transactions", .timeLimit(.minutes(5)))
struct AppStoreTests {
    static func products(_ h: Harness) async throws {
        try await h.createPlan("free", company: 5, user: 5, isDefault: true)
        try await h.createPlan("low", company: 100, user: 25, sort: 1)
        try await h.createPlan("high", company: 1000, user: 250, sort: 2)
        for (product, plan) in [("app.low.monthly", "low"), ("app.high.monthly", "high")] {
            let reply = try await h.op(
                .POST, "/admin/v1/products", .obj(["product_id": .string(product), "plan_id": .string(plan), "interval": "month"]))
            #expect(reply.status == 201, "\(reply.body)")
        }
    }

    @Test(
        "verification: valid; tampered payload or nested transaction; wrong root; expired leaf; missing OIDs; bundle; environment; app id")
    func verification() async throws {
        try await Harness.with(settings: AppleFixture.settings(environments: "Production")) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let signer = f.signer
            let (company, _) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(company)
            let tx = try f.transaction("v1", token: token)
            let fields = f.notificationFields("SUBSCRIBED", "INITIAL_BUY", uuid: "n-valid", transaction: tx)

            var refused: [(String, String)] = []
            // A forged payload under a real signature.
            let real = try signer.sign(fields)
            var forged = fields
            forged["notificationUUID"] = "n-forged"
            refused.append(("tampered payload", try f.tampered(real, forged)))
            // A nested transaction for another company under the transaction's real signature.
            var forgedTx = f.transactionFields("v1", token: UUID())
            forgedTx["productId"] = "app.high.monthly"
            var nested = fields
            nested["notificationUUID"] = "n-nested"
            nested["data"] = (fields["data"] as! [String: Any]).merging(["signedTransactionInfo": try f.tampered(tx, forgedTx)]) { $1 }
            refused.append(("tampered nested transaction", try signer.sign(nested)))
            refused.append(("wrong root", try f.notification("SUBSCRIBED", transaction: tx, chain: signer.otherRoot)))
            refused.append(("expired leaf", try f.notification("SUBSCRIBED", transaction: tx, chain: signer.expiredLeaf)))
            refused.append(("leaf without OID", try f.notification("SUBSCRIBED", transaction: tx, chain: signer.leafWithoutOID)))
            refused.append(
                ("intermediate without OID", try f.notification("SUBSCRIBED", transaction: tx, chain: signer.intermediateWithoutOID)))
            refused.append(
                (
                    "nested transaction signed by a wrong root",
                    try f.notification("SUBSCRIBED", transaction: try f.transaction("v2", token: token, chain: signer.otherRoot))
                ))
            refused.append(("wrong bundle id", try f.notification("SUBSCRIBED", transaction: tx, bundle: "com.example.other")))
            refused.append(
                (
                    "nested transaction of another bundle",
                    try f.notification("SUBSCRIBED", transaction: try f.transaction("v3", token: token, bundle: "com.example.other"))
                ))
            refused.append(
                (
                    "sandbox where only Production is accepted",
                    try f.notification(
                        "SUBSCRIBED", transaction: try f.transaction("v4", token: token, environment: "Sandbox"), environment: "Sandbox"
                    )
                ))
            refused.append(("wrong appAppleId in Production", try f.notification("SUBSCRIBED", transaction: tx, appID: 42)))
            refused.append(("no appAppleId in Production", try f.notification("SUBSCRIBED", transaction: tx, appID: nil)))
            refused.append(("not a JWS", "abc.def"))
            // Signed, but with a repeated member name: CapGate and Apple's libraries could read it apart.
            let plain = f.notificationFields("SUBSCRIBED", transaction: tx)
            let text = String(decoding: try JSONSerialization.data(withJSONObject: plain, options: [.sortedKeys]), as: UTF8.self)
            let repeated = text.replacingOccurrences(of: "{", with: #"{"notificationType":"TEST","#)
            refused.append(("a repeated member", try f.signer.sign(repeated)))
            for (name, jws) in refused {
                let reply = try await h.appleNotification(jws)
                #expect(reply.status == 400, "\(name): \(reply.body)")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error", "\(name)")
                // A sentence, never a library's dump (a chain's certificates, an empty list).
                let message = reply.json["error"]?["message"]?.stringValue ?? ""
                #expect(message.count < 300 && !message.contains("[]") && !message.contains("Certificate("), "\(name): \(message)")
            }
            #expect(try await h.scalar("SELECT count(*) FROM apple_notifications") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE transaction_id LIKE 'apple:%'") == 0)
            #expect(try await h.currentPeriod(company).plan == "free")

            // The expired leaf verifies for a payload signed while it was valid (validity at signedDate).
            let old = f.now - 86400 * 1.5
            let signedThen = try f.notification(
                "TEST", uuid: "n-old", signed: old, chain: signer.expiredLeaf)
            #expect(try await h.appleNotification(signedThen).status == 200)

            let valid = try await h.appleNotification(real)
            #expect(valid.status == 200, "\(valid.body)")
            #expect(valid.json["outcome"]?.stringValue == "applied")
            #expect(try await h.currentPeriod(company).plan == "low")
            // A transaction posted by the app is verified the same way.
            let users = try await h.createUser(company: company)
            forgedTx["appAccountToken"] = token.text
            #expect(try await h.appleTransaction(try f.tampered(tx, forgedTx), key: users.key).status == 400)
            for chain in [signer.otherRoot, signer.expiredLeaf, signer.leafWithoutOID, signer.intermediateWithoutOID] {
                let reply = try await h.appleTransaction(try f.transaction("p1", token: token, chain: chain), key: users.key)
                #expect(reply.status == 400, "\(reply.body)")
                let message = reply.json["error"]?["message"]?.stringValue ?? ""
                #expect(message.contains("does not verify to apple.rootCertificates") && message.count < 300, "\(message)")
            }
        }
    }

    @Test("environments: Sandbox accepted when listed, without an appAppleId; Production still needs it")
    func environments() async throws {
        try await Harness.with(settings: AppleFixture.settings(environments: "Production,Sandbox")) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (company, _) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(company)
            let sandbox = try f.notification(
                "SUBSCRIBED", transaction: try f.transaction("s1", token: token, environment: "Sandbox"), environment: "Sandbox",
                appID: nil)
            let reply = try await h.appleNotification(sandbox)
            #expect(reply.status == 200, "\(reply.body)")
            #expect(try await h.currentPeriod(company).plan == "low")
            // A Sandbox notification may not carry a Production transaction.
            let mixed = try f.notification(
                "SUBSCRIBED", transaction: try f.transaction("s2", token: token), environment: "Sandbox", appID: nil)
            #expect(try await h.appleNotification(mixed).status == 400)
            #expect(try await h.appleNotification(try f.notification("TEST", appID: nil)).status == 400)
            #expect(try await h.appleNotification(try f.notification("TEST")).status == 200)
        }
    }

    @Test("each notification type and subtype to the plan and period it leaves")
    func mapping() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            var clock = f.now - 3600
            func next() -> Date {
                clock += 10
                return clock
            }
            func send(_ type: String, _ subtype: String? = nil, _ tx: String?, renewal: String? = nil) async throws -> String? {
                let reply = try await h.appleNotification(
                    try f.notification(type, subtype, signed: next(), transaction: tx, renewal: renewal))
                #expect(reply.status == 200, "\(type) \(subtype ?? ""): \(reply.body)")
                return reply.json["outcome"]?.stringValue
            }
            let month = f.now + 86400 * 30
            let twoMonths = f.now + 86400 * 60
            let seconds = { (date: Date) in Int64(date.timeIntervalSince1970) }

            // SUBSCRIBED → purchase; renewal status off and on; DID_RENEW → renewal.
            let (a, _) = try await h.createCompany(plan: "free", users: 1)
            let aToken = try await h.appAccountToken(a)
            #expect(try await send("SUBSCRIBED", "INITIAL_BUY", try f.transaction("a1", token: aToken, expires: month)) == "applied")
            #expect(try await h.currentPeriod(a) == ("low", seconds(month), true))
            #expect(
                try await send("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", try f.transaction("a1", token: aToken, expires: month))
                    == "applied")
            #expect(try await h.currentPeriod(a) == ("low", seconds(month), false))
            #expect(
                try await send("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", try f.transaction("a1", token: aToken, expires: month))
                    == "applied")
            #expect(try await h.currentPeriod(a) == ("low", seconds(month), true))
            // Later notifications carry no appAppleToken: the subscription's link finds the company.
            #expect(
                try await send("DID_RENEW", nil, try f.transaction("a2", original: "a1", token: nil, purchase: month, expires: twoMonths))
                    == "applied")
            #expect(try await h.currentPeriod(a) == ("low", seconds(twoMonths), true))
            // UPGRADE: the new product at once. DOWNGRADE: kept; the renewal that follows carries it.
            let upgradeEnd = f.now + 86400 * 29
            #expect(
                try await send(
                    "DID_CHANGE_RENEWAL_PREF", "UPGRADE",
                    try f.transaction(
                        "a3", original: "a1", product: "app.high.monthly", token: aToken, purchase: f.now - 5, expires: upgradeEnd))
                    == "applied")
            #expect(try await h.currentPeriod(a) == ("high", seconds(upgradeEnd), true))
            #expect(
                try await send(
                    "DID_CHANGE_RENEWAL_PREF", "DOWNGRADE",
                    try f.transaction(
                        "a3", original: "a1", product: "app.high.monthly", token: aToken, purchase: f.now - 5, expires: upgradeEnd),
                    renewal: try f.renewal(original: "a1", product: "app.high.monthly", next: "app.low.monthly")) == "kept")
            #expect(try await h.currentPeriod(a) == ("high", seconds(upgradeEnd), true))
            let afterDowngrade = upgradeEnd + 86400 * 30
            #expect(
                try await send(
                    "DID_RENEW", nil,
                    try f.transaction("a4", original: "a1", token: aToken, purchase: upgradeEnd, expires: afterDowngrade)) == "applied")
            #expect(try await h.currentPeriod(a) == ("high", seconds(upgradeEnd), true))
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM plan_periods WHERE company_id = '\(a.text)' AND plan_id = 'low' AND started_at = to_timestamp(\(seconds(upgradeEnd))) AND ends_at = to_timestamp(\(seconds(afterDowngrade)))"
                ) == 1)

            // Grace period: the period runs to gracePeriodExpiresDate; then it expires.
            let (b, _) = try await h.createCompany(plan: "free", users: 1)
            let bToken = try await h.appAccountToken(b)
            let soon = f.now + 3600
            let grace = f.now + 86400 * 16
            #expect(try await send("SUBSCRIBED", "RESUBSCRIBE", try f.transaction("b1", token: bToken, expires: soon)) == "applied")
            #expect(
                try await send(
                    "DID_FAIL_TO_RENEW", "GRACE_PERIOD", try f.transaction("b1", token: bToken, expires: soon),
                    renewal: try f.renewal(original: "b1", grace: grace)) == "applied")
            #expect(try await h.currentPeriod(b) == ("low", seconds(grace), true))
            #expect(try await send("GRACE_PERIOD_EXPIRED", nil, try f.transaction("b1", token: bToken, expires: soon)) == "applied")
            #expect(try await h.currentPeriod(b).plan == "free")

            // EXPIRED, DID_FAIL_TO_RENEW without grace → expire; REFUND, REVOKE → refund; REFUND_REVERSED → restore.
            for (index, (type, subtype)) in [
                ("EXPIRED", "VOLUNTARY"), ("EXPIRED", "BILLING_RETRY"), ("DID_FAIL_TO_RENEW", nil), ("REFUND", nil), ("REVOKE", nil),
            ].enumerated() {
                let (c, _) = try await h.createCompany(plan: "free", users: 1)
                let cToken = try await h.appAccountToken(c)
                let tx = try f.transaction("c\(index)", token: cToken, expires: month)
                #expect(try await send("SUBSCRIBED", "INITIAL_BUY", tx) == "applied")
                #expect(try await h.currentPeriod(c).plan == "low")
                #expect(try await send(type, subtype, tx) == "applied")
                #expect(try await h.currentPeriod(c).plan == "free", "\(type) \(subtype ?? "")")
                if type == "REFUND" {
                    #expect(try await send("REFUND_REVERSED", nil, tx) == "applied")
                    #expect(try await h.currentPeriod(c) == ("low", seconds(month), true))
                }
            }

            // OFFER_REDEEMED: as the purchase it is.
            let (d, _) = try await h.createCompany(plan: "free", users: 1)
            let dToken = try await h.appAccountToken(d)
            #expect(try await send("OFFER_REDEEMED", "INITIAL_BUY", try f.transaction("d1", token: dToken, expires: month)) == "applied")
            #expect(try await h.currentPeriod(d).plan == "low")

            // TEST and a type CapGate does not apply: stored, nothing applied. A one-time charge and its
            // refund apply to a top-up product (TopUpTests); this one's product is not mapped: failed.
            let (e, _) = try await h.createCompany(plan: "free", users: 1)
            let eToken = try await h.appAccountToken(e)
            #expect(try await send("TEST", nil, nil) == "stored")
            #expect(
                try await send("ONE_TIME_CHARGE", nil, try f.transaction("e1", product: "app.pack.1000", token: eToken, type: "Consumable"))
                    == "failed")
            #expect(
                try await send("REFUND", nil, try f.transaction("e1", product: "app.pack.1000", token: eToken, type: "Consumable"))
                    == "failed"
            )
            #expect(try await send("PRICE_INCREASE", "PENDING", try f.transaction("e2", token: eToken)) == "stored")
            #expect(try await h.currentPeriod(e).plan == "free")
            #expect(
                try await h.scalar("SELECT count(*) FROM apple_notifications WHERE company_id = '\(e.text)' AND outcome = 'stored'") == 1)
            // A product no plan maps: stored as failed, with the reason, and answered 200 (Apple would retry).
            #expect(try await send("SUBSCRIBED", "INITIAL_BUY", try f.transaction("e3", product: "app.nope", token: eToken)) == "failed")
            #expect(try await h.text("SELECT detail FROM apple_notifications WHERE transaction_id = 'e3'")?.contains("app.nope") == true)
        }
    }

    @Test("idempotent by notificationUUID; out-of-order is stored, not applied; an unknown company is stored unmatched and listed")
    func deliveries() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (company, _) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(company)
            let month = f.now + 86400 * 30
            let before = try await h.scalar("SELECT count(*) FROM billing_events WHERE company_id = '\(company.text)'")
            let subscribed = try f.notification(
                "SUBSCRIBED", "INITIAL_BUY", uuid: "dup-1", signed: f.now - 300,
                transaction: try f.transaction("o1", token: token, expires: month))
            #expect(try await h.appleNotification(subscribed).json["outcome"]?.stringValue == "applied")
            let again = try await h.appleNotification(subscribed)
            #expect(again.status == 200)
            #expect(again.json["outcome"]?.stringValue == "duplicate")
            #expect(try await h.scalar("SELECT count(*) FROM apple_notifications") == 1)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE company_id = '\(company.text)'") == before + 1)

            // Concurrent deliveries of one notification: one applies, the others are duplicates.
            let renew = try f.notification(
                "DID_RENEW", uuid: "dup-2", signed: f.now - 200,
                transaction: try f.transaction("o2", original: "o1", token: token, purchase: month, expires: month + 86400 * 30))
            let outcomes = try await withThrowingTaskGroup(of: String?.self) { group in
                for _ in 0..<6 { group.addTask { try await h.appleNotification(renew).json["outcome"]?.stringValue } }
                return try await group.reduce(into: [String?]()) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == "applied" }.count == 1)
            #expect(outcomes.filter { $0 == "duplicate" }.count == 5)

            // EXPIRED signed at -100 applied; a renewal signed at -150 arriving after it is stale.
            let expired = try f.notification(
                "EXPIRED", "VOLUNTARY", signed: f.now - 100, transaction: try f.transaction("o2", original: "o1", token: token))
            #expect(try await h.appleNotification(expired).json["outcome"]?.stringValue == "applied")
            #expect(try await h.currentPeriod(company).plan == "free")
            let late = try f.notification(
                "DID_RENEW", signed: f.now - 150,
                transaction: try f.transaction("o3", original: "o1", token: token, expires: month + 86400 * 60))
            #expect(try await h.appleNotification(late).json["outcome"]?.stringValue == "stale")
            #expect(try await h.currentPeriod(company).plan == "free")
            #expect(try await h.scalar("SELECT count(*) FROM apple_notifications WHERE outcome = 'stale'") == 1)

            // No company: an unknown appAccountToken, or none on an unlinked subscription.
            let stranger = try f.notification(
                "SUBSCRIBED", "INITIAL_BUY", uuid: "lost-1", transaction: try f.transaction("u1", token: UUID()))
            let nobody = try f.notification("SUBSCRIBED", "INITIAL_BUY", uuid: "lost-2", transaction: try f.transaction("u2", token: nil))
            for jws in [stranger, nobody] {
                let reply = try await h.appleNotification(jws)
                #expect(reply.status == 200)
                #expect(reply.json["outcome"]?.stringValue == "unmatched")
            }
            let listed = try await h.op(.GET, "/admin/v1/billing/apple/unmatched")
            #expect(listed.status == 200, "\(listed.body)")
            let ids = listed.json["data"]?.arrayValue?.compactMap { $0["notification_uuid"]?.stringValue } ?? []
            #expect(Set(ids) == ["lost-1", "lost-2"])
            #expect(listed.json["data"]?.arrayValue?.first?["original_transaction_id"]?.stringValue?.hasPrefix("u") == true)
            let (_, users) = try await h.createCompany(plan: "free", users: 1, role: "admin")
            #expect(try await h.request(.GET, "/admin/v1/billing/apple/unmatched", headers: [("x-api-key", users[0].key)]).status == 403)
        }
    }

    @Test("a transaction posted by the app applies at once; its notification changes nothing; another company's is 403")
    func transactions() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.products(h)
            let f = AppleFixture()
            let (a, aUsers) = try await h.createCompany(plan: "free", users: 1)
            let aToken = try await h.appAccountToken(a)
            let (b, bUsers) = try await h.createCompany(plan: "free", users: 1, role: "admin")
            let bToken = try await h.appAccountToken(b)
            // The app learns the company's purchase token for appAccountToken from GET /v1/usage.
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", aUsers[0].key)])
            #expect(usage.json["company_id"]?.stringValue == a.text)
            #expect(usage.json["user_id"]?.stringValue == aUsers[0].id.text)
            #expect(usage.json["app_account_token"]?.stringValue == aToken.text)
            let month = f.now + 86400 * 30
            let tx = try f.transaction("t1", token: aToken, expires: month)
            let posted = try await h.appleTransaction(tx, key: aUsers[0].key)
            #expect(posted.status == 200, "\(posted.body)")
            #expect(posted.json["company"]?["plan"]?.stringValue == "low")
            #expect(try await h.currentPeriod(a) == ("low", Int64(month.timeIntervalSince1970), true))
            let events = try await h.scalar("SELECT count(*) FROM billing_events WHERE company_id = '\(a.text)'")
            let periods = try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(a.text)'")
            // Posting it again, and the notification for it, change nothing.
            #expect(try await h.appleTransaction(tx, key: aUsers[0].key).body == posted.body)
            let notified = try await h.appleNotification(try f.notification("SUBSCRIBED", "INITIAL_BUY", transaction: tx))
            #expect(notified.status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE company_id = '\(a.text)'") == events)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(a.text)'") == periods)

            // Company B's admin posting A's transaction: 403, nothing applied to anyone.
            let other = try await h.appleTransaction(try f.transaction("t2", token: aToken), key: bUsers[0].key)
            #expect(other.status == 403, "\(other.body)")
            #expect(other.json["error"]?["type"]?.stringValue == "permission_error")
            // No appAccountToken, or A's subscription claimed with B's token: 403 too.
            #expect(try await h.appleTransaction(try f.transaction("t3", token: nil), key: bUsers[0].key).status == 403)
            #expect(try await h.appleTransaction(try f.transaction("t4", original: "t1", token: bToken), key: bUsers[0].key).status == 403)
            #expect(try await h.currentPeriod(b).plan == "free")
            // The operator is no company's member.
            #expect(
                try await h.request(
                    .POST, "/v1/billing/apple/transactions", headers: h.asOperator, json: .obj(["signedTransaction": .string(tx)])
                ).status == 403)
            #expect(try await h.appleTransaction("not.a.jws", key: aUsers[0].key).status == 400)
            #expect(
                try await h.request(.POST, "/v1/billing/apple/transactions", json: .obj(["signedTransaction": .string(tx)])).status == 401)
        }
    }

    @Test("the shipped Apple Root CA - G3 is the default root and has Apple's published fingerprint")
    func shippedRoot() async throws {
        let root = try AppleSettings.shippedRoot()
        #expect(root.subject.description.contains("Apple Root CA - G3"))
        let configuration = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent/capgate.json")
        #expect(configuration.apple.rootCertificates == [root])
        #expect(configuration.apple.environments == ["Production"])
        var serializer = DER.Serializer()
        try serializer.serialize(root)
        let fingerprint = SHA256.hash(data: serializer.serializedBytes).map { String(format: "%02X", $0) }.joined()
        // As Apple's certificate authority page publishes it (and ../shared/data/README.md).
        #expect(fingerprint == "63343ABFB89A6A03EBB57E9B3F5FA7BE7C4F5C756F3017B3A8C488C3653E9179")
    }
}
