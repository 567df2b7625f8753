import CapGate
import Foundation
import Testing

/// SPEC §12 "Top-ups" through the real gateway and PostgreSQL: top-up products, grants from the
/// App Store (signed by the test PKI) and from the operator's store events, refunds of a pack,
/// and a tenant trying to take another's.
@Suite("Top-ups: products, grants, refunds", .timeLimit(.minutes(5)))
struct TopUpTests {
    /// A default plan whose company cap is 2 (so a pack is drawn on at the third call).
    static func plans(_ h: Harness) async throws {
        try await h.createPlan("free", company: 2, user: nil, isDefault: true)
        try await h.createPlan("low", company: 100, user: 25, sort: 1)
        let reply = try await h.op(
            .POST, "/admin/v1/products", .obj(["product_id": "app.low.monthly", "plan_id": "low", "interval": "month"]))
        #expect(reply.status == 201, "\(reply.body)")
    }

    @Test("products: a top-up has kind, units and/or budget and valid_days, no plan; a bad field is 400 naming it and creates nothing")
    func products() async throws {
        try await Harness.with { h in
            try await Self.plans(h)
            let pack = try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "pack.50", "kind": "topup", "units": 50]))
            #expect(pack.status == 201, "\(pack.body)")
            #expect(
                pack.body
                    == #"{"budget":null,"id":"pack.50","interval":null,"kind":"topup","plan_id":null,"product_id":"pack.50","units":50,"#
                    + #""valid_days":365}"#)
            let cash = try await h.op(
                .POST, "/admin/v1/products", .obj(["product_id": "pack.cash", "kind": "topup", "budget": "2.5", "valid_days": 30]))
            #expect(cash.status == 201 && cash.json["budget"]?.stringValue == "2.5" && cash.json["valid_days"]?.intValue == 30)
            let bad: [(String, JSON, String)] = [
                ("kind", .obj(["product_id": "x1", "kind": "bundle", "units": 5]), "'kind'"),
                ("plan on a top-up", .obj(["product_id": "x2", "kind": "topup", "units": 5, "plan_id": "low"]), "'plan_id'"),
                ("interval on a top-up", .obj(["product_id": "x3", "kind": "topup", "units": 5, "interval": "month"]), "'interval'"),
                ("nothing granted", .obj(["product_id": "x4", "kind": "topup"]), "'units' and/or 'budget'"),
                ("nothing granted (nulls)", .obj(["product_id": "x5", "kind": "topup", "units": .null, "budget": .null]), "'budget'"),
                ("units 0", .obj(["product_id": "x6", "kind": "topup", "units": 0]), "'units'"),
                ("units negative", .obj(["product_id": "x7", "kind": "topup", "units": -3]), "'units'"),
                ("units fraction", .obj(["product_id": "x8", "kind": "topup", "units": 1.5]), "'units'"),
                ("units as text", .obj(["product_id": "x9", "kind": "topup", "units": "5"]), "'units'"),
                ("budget 0", .obj(["product_id": "x10", "kind": "topup", "budget": "0"]), "'budget'"),
                ("budget a number", .obj(["product_id": "x11", "kind": "topup", "budget": 5]), "'budget'"),
                ("budget negative", .obj(["product_id": "x12", "kind": "topup", "budget": "-1"]), "'budget'"),
                ("budget 7 decimals", .obj(["product_id": "x13", "kind": "topup", "budget": "0.0000001"]), "'budget'"),
                ("valid_days 0", .obj(["product_id": "x14", "kind": "topup", "units": 5, "valid_days": 0]), "'valid_days'"),
                ("valid_days too long", .obj(["product_id": "x15", "kind": "topup", "units": 5, "valid_days": 36_601]), "'valid_days'"),
                ("units on a subscription", .obj(["product_id": "x16", "plan_id": "low", "units": 5]), "'units'"),
                ("valid_days on a subscription", .obj(["product_id": "x17", "plan_id": "low", "valid_days": 30]), "'valid_days'"),
                ("a subscription without a plan", .obj(["product_id": "x18", "kind": "subscription"]), "'plan_id'"),
            ]
            for (name, body, field) in bad {
                let reply = try await h.op(.POST, "/admin/v1/products", body)
                #expect(reply.status == 400, "\(name): \(reply.body)")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error", "\(name)")
                #expect(reply.json["error"]?["message"]?.stringValue?.contains(field) == true, "\(name): \(reply.body)")
            }
            #expect(try await h.scalar("SELECT count(*) FROM products") == 3)
            let list = try await h.op(.GET, "/admin/v1/products")
            let kinds = list.json["data"]?.arrayValue?.compactMap { $0["kind"]?.stringValue } ?? []
            #expect(kinds.sorted() == ["subscription", "topup", "topup"], "\(list.body)")
        }
    }

    @Test(
        "grants: a ONE_TIME_CHARGE and the app's posted transaction grant once per transaction, plan untouched; the usage reads list them")
    func grantOnce() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.plans(h)
            try await h.createTopUp("app.pack.10", units: 10)
            let f = AppleFixture()
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(company)
            let period = try await h.text("SELECT id::text FROM plan_periods WHERE company_id = '\(company.text)'")
            let t1 = try f.transaction("c-1", product: "app.pack.10", token: token, purchase: f.now - 60, type: "Consumable")
            let charge = try f.notification("ONE_TIME_CHARGE", uuid: "n-c1", transaction: t1)
            let first = try await h.appleNotification(charge)
            #expect(first.status == 200 && first.json["outcome"]?.stringValue == "applied", "\(first.body)")
            // The same notification again, another notification of the same transaction, the app's post of it.
            #expect(try await h.appleNotification(charge).json["outcome"]?.stringValue == "duplicate")
            let again = try await h.appleNotification(try f.notification("ONE_TIME_CHARGE", uuid: "n-c1b", transaction: t1))
            #expect(again.status == 200)
            let posted = try await h.appleTransaction(t1, key: users[0].key)
            #expect(posted.status == 200, "\(posted.body)")
            #expect(try await h.scalar("SELECT count(*) FROM topup_grants") == 1)
            // A new purchase posted by the app first, its notification after: one more grant.
            let t2 = try f.transaction("c-2", product: "app.pack.10", token: token, type: "Consumable")
            let second = try await h.appleTransaction(t2, key: users[0].key)
            #expect(second.status == 200 && second.json["grant"]?["granted"]?["units"]?.intValue == 10, "\(second.body)")
            #expect(try await h.appleNotification(try f.notification("ONE_TIME_CHARGE", transaction: t2)).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM topup_grants WHERE company_id = '\(company.text)'") == 2)
            // Granted for valid_days (365) from the purchase; the plan and its period are as they were.
            let days = try await h.scalar(
                "SELECT extract(epoch FROM expires_at - granted_at)::bigint / 86400 FROM topup_grants WHERE transaction_id = 'c-1'")
            #expect(days == 365)
            #expect(try await h.text("SELECT string_agg(id::text, ',') FROM plan_periods WHERE company_id = '\(company.text)'") == period)

            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            let grants = usage.json["grants"]?.arrayValue ?? []
            #expect(grants.count == 2, "\(usage.body)")
            let g = grants.first ?? .null
            #expect(g["id"]?.intValue != nil && g["product_id"]?.stringValue == "app.pack.10")
            #expect(g["granted"]?["units"]?.intValue == 10 && g["used"]?["units"]?.intValue == 0)
            #expect(g["remaining"]?["units"]?.intValue == 10 && g["granted"]?["budget"] == .null)
            #expect(g["expires_at"]?.stringValue != nil && g["status"]?.stringValue == "active")
            let admin = try await h.op(.GET, "/admin/v1/companies/\(company.text)/usage")
            #expect(admin.json["grants"]?.arrayValue?.count == 2 && admin.json["usage"]?["grants"]?.arrayValue?.count == 2)
            // A one-time purchase of a subscription product changes no plan: stored as failed, with the reason.
            let odd = try f.transaction("c-3", product: "app.low.monthly", token: token, type: "Consumable")
            let failed = try await h.appleNotification(try f.notification("ONE_TIME_CHARGE", uuid: "n-odd", transaction: odd))
            #expect(failed.json["outcome"]?.stringValue == "failed", "\(failed.body)")
            #expect(try await h.currentPeriod(company).plan == "free")
        }
    }

    @Test(
        "refund of a pack: what is left is gone, the plan stays; REFUND_REVERSED gives it back; a refund first makes the purchase grant nothing"
    )
    func refund() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.plans(h)
            try await h.createTopUp("app.pack.5", units: 5)
            let f = AppleFixture()
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            let token = try await h.appAccountToken(company)
            let key = users[0].key
            let tx = try f.transaction("r-1", product: "app.pack.5", token: token, type: "Consumable")
            #expect(try await h.appleNotification(try f.notification("ONE_TIME_CHARGE", signed: f.now - 20, transaction: tx)).status == 200)
            for _ in 0..<4 { #expect(try await h.message(key: key).status == 200) }
            #expect(try await h.grant("r-1").units == 2)
            let refund = try await h.appleNotification(try f.notification("REFUND", signed: f.now - 10, transaction: tx))
            #expect(refund.json["outcome"]?.stringValue == "applied", "\(refund.body)")
            let refused = try await h.message(key: key)
            #expect(refused.status == 402 && refused.json["error"]?["type"]?.stringValue == "usage_cap_exceeded", "\(refused.body)")
            #expect(try await h.currentPeriod(company).plan == "free")
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", key)])
            let g = usage.json["grants"]?.arrayValue?.first ?? .null
            #expect(g["status"]?.stringValue == "refunded" && g["remaining"]?["units"]?.intValue == 0 && g["used"]?["units"]?.intValue == 2)
            // The refund reversed: the pack's 3 units are back.
            #expect(try await h.appleNotification(try f.notification("REFUND_REVERSED", signed: f.now - 5, transaction: tx)).status == 200)
            for _ in 0..<3 { #expect(try await h.message(key: key).status == 200) }
            #expect(try await h.message(key: key).status == 402)

            // Refunded before CapGate heard of the purchase: the app's later post grants nothing.
            let early = try f.transaction("r-2", product: "app.pack.5", token: token, type: "Consumable")
            #expect(try await h.appleNotification(try f.notification("REFUND", transaction: early)).status == 200)
            #expect(try await h.appleTransaction(early, key: key).status == 200)
            #expect(try await h.message(key: key).status == 402)
            // A transaction Apple revoked, posted by the app, grants nothing either.
            var revoked = f.transactionFields("r-3", product: "app.pack.5", token: token, type: "Consumable")
            revoked["revocationDate"] = AppleTestSigner.millis(f.now - 5)
            #expect(try await h.appleTransaction(try f.signer.sign(revoked), key: key).status == 200)
            #expect(try await h.message(key: key).status == 402)
            #expect(
                try await h.scalar("SELECT count(*) FROM topup_grants WHERE refunded_at IS NULL AND company_id = '\(company.text)'") == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("another company's transaction grants nothing to you: not by the app's post, not by a store event")
    func isolation() async throws {
        try await Harness.with(settings: AppleFixture.settings()) { h in
            try await Self.plans(h)
            try await h.createTopUp("app.pack.5", units: 5)
            let f = AppleFixture()
            let (a, aUsers) = try await h.createCompany(plan: "free", users: 1)
            let aToken = try await h.appAccountToken(a)
            let (b, bUsers) = try await h.createCompany(plan: "free", users: 1)
            let bToken = try await h.appAccountToken(b)
            let mine = try f.transaction("i-1", product: "app.pack.5", token: aToken, type: "Consumable")
            // B posts A's signed transaction: its appAccountToken is A's.
            #expect(try await h.appleTransaction(mine, key: bUsers[0].key).status == 403)
            #expect(try await h.appleTransaction(mine, key: aUsers[0].key).status == 200)
            // B signs nothing; a transaction of the same id naming B (as a replay of A's purchase would) is refused.
            let replay = try f.transaction("i-1", product: "app.pack.5", token: bToken, type: "Consumable")
            #expect(try await h.appleTransaction(replay, key: bUsers[0].key).status == 403)
            // The operator's store event for B naming A's purchase: 409, nothing granted.
            let event = try await h.storeEvent("purchase", company: b, product: "app.pack.5", transaction: "op-1", original: "i-1")
            #expect(event.status == 409, "\(event.body)")
            #expect(try await h.scalar("SELECT count(*) FROM topup_grants WHERE company_id = '\(b.text)'") == 0)
            let bUsage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", bUsers[0].key)])
            #expect(bUsage.json["grants"]?.arrayValue?.isEmpty == true, "\(bUsage.body)")
            // B's calls stop at B's cap; A's go on to its grant.
            for _ in 0..<2 { _ = try await h.message(key: bUsers[0].key) }
            #expect(try await h.message(key: bUsers[0].key).status == 402)
            for _ in 0..<3 { #expect(try await h.message(key: aUsers[0].key).status == 200) }
            #expect(try await h.grant("i-1").units == 1)
            // A top-up refund posted without the purchase it takes back is 400.
            let vague = try await h.storeEvent("refund", company: a, product: "app.pack.5", transaction: "op-2")
            #expect(vague.status == 400 && vague.body.contains("original_transaction_id"), "\(vague.body)")
        }
    }
}
