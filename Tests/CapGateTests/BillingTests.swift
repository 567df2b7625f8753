import CapGate
import Foundation
import Testing

@Suite("Billing lifecycle", .timeLimit(.minutes(5)))
struct BillingTests {
    static func date(_ text: String) -> Date { Timestamp.parse(text)! }

    static func rollover(_ h: Harness, at: String, dryRun: Bool = false) async throws -> BillingStore.RolloverSummary {
        try await CapGateRunner.rollover(url: h.databaseURL, at: date(at), dryRun: dryRun, logger: TestCluster.logger)
    }

    static func periods(_ h: Harness, _ company: UUID) async throws -> [(plan: String, start: Date, end: Date)] {
        try await h.db.query(
            "SELECT plan_id, started_at, ends_at FROM plan_periods WHERE company_id = \(company) ORDER BY started_at",
            logger: TestCluster.logger
        ).decode((String, Date, Date).self).collect().map { ($0.0, $0.1, $0.2) }
    }

    @Test("rollover across a year for anchors on the 1st, 15th, 29th, 30th and 31st: bounds from the anchor, clamped")
    func rolloverAcrossAYear() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            var companies: [(UUID, Date)] = []
            for day in [1, 15, 29, 30, 31] {
                let anchor = String(format: "2026-01-%02dT10:00:00Z", day)
                let (company, _) = try await h.createCompany(plan: "low", users: 0, startedAt: anchor)
                companies.append((company, Self.date(anchor)))
            }
            // Roll at the middle of each month for a year (and at each exact boundary).
            for month in 2...13 {
                let year = month > 12 ? 2027 : 2026
                let m = month > 12 ? month - 12 : month
                _ = try await Self.rollover(h, at: String(format: "%04d-%02d-20T00:00:00Z", year, m))
            }
            for (company, anchor) in companies {
                let periods = try await Self.periods(h, company)
                let last = PeriodMath.period(containing: Self.date("2027-01-20T00:00:00Z"), anchor: anchor, interval: .month)
                #expect(periods.count == last.index + 1)
                for (k, period) in periods.enumerated() {
                    let expected = PeriodMath.bounds(anchor: anchor, interval: .month, index: k)
                    #expect(period.start == expected.start && period.end == expected.end, "k=\(k) \(period)")
                    #expect(period.plan == "low")
                }
            }
            // Twice changes nothing the second time.
            let again = try await Self.rollover(h, at: "2027-01-20T00:00:00Z")
            #expect(again.moved == 0)
            #expect(again.unchanged == 5)
        }
    }

    @Test("missed months are caught up in one run; --dry-run changes nothing")
    func catchUp() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, _) = try await h.createCompany(plan: "low", users: 0, startedAt: "2026-01-31T00:00:00Z")
            let dry = try await Self.rollover(h, at: "2026-06-15T00:00:00Z", dryRun: true)
            #expect(dry.moved == 1)
            #expect(dry.description.contains("dry run"))
            #expect(try await Self.periods(h, company).count == 1)
            let summary = try await Self.rollover(h, at: "2026-06-15T00:00:00Z")
            #expect(summary.description == "moved 1 companies, 0 to default plan, 0 unchanged")
            let periods = try await Self.periods(h, company)
            #expect(periods.count == 2)
            #expect(periods[1].start == Self.date("2026-05-31T00:00:00Z"))
            #expect(periods[1].end == Self.date("2026-06-30T00:00:00Z"))
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE type = 'rollover'") == 1)
        }
    }

    @Test("cancelled → default plan at rollover; no default plan → 402 no_active_plan")
    func cancelledAndNoDefault() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 5, user: 5, isDefault: true)
            try await h.createPlan("low", company: 100, user: 25, sort: 1)
            let now = Date()
            let start = Timestamp.format(now.addingTimeInterval(-40 * 86400))
            let (company, users) = try await h.createCompany(plan: "low", users: 1, startedAt: start)
            try await h.exec("UPDATE plan_periods SET auto_renew = false, status = 'cancelled' WHERE company_id = '\(company.text)'")
            let summary = try await CapGateRunner.rollover(url: h.databaseURL, at: now, dryRun: false, logger: TestCluster.logger)
            #expect(summary.toDefault == 1)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.json["plan"]?["id"]?.stringValue == "free")

            // Without a default plan, an expired company has no plan.
            try await h.exec("UPDATE plans SET is_default = false")
            let (other, others) = try await h.createCompany(plan: "low", users: 1, startedAt: start)
            try await h.exec("UPDATE plan_periods SET auto_renew = false WHERE company_id = '\(other.text)'")
            let second = try await CapGateRunner.rollover(url: h.databaseURL, at: now, dryRun: false, logger: TestCluster.logger)
            #expect(second.withoutPlan == 1)
            let denied = try await h.message(key: others[0].key)
            #expect(denied.status == 402)
            #expect(denied.json["error"]?["type"]?.stringValue == "no_active_plan")
            let third = try await CapGateRunner.rollover(url: h.databaseURL, at: now, dryRun: false, logger: TestCluster.logger)
            #expect(third.withoutPlan == 0 && third.moved == 0)
        }
    }

    @Test("the SQL period bounds (used by rollover and pg_cron) agree with PeriodMath for month-end and leap-year anchors")
    func sqlBoundsAgree() async throws {
        try await Harness.with { h in
            for anchor in ["2026-01-31T10:00:00Z", "2028-02-29T23:59:59Z", "2026-01-30T00:00:00Z", "2026-03-15T12:30:00Z"] {
                for k in [0, 1, 2, 11, 12, 13, 25, 48] {
                    let sql = try await h.db.query(
                        "SELECT capgate_period_bound(\(Self.date(anchor)), \(Int32(k)))", logger: TestCluster.logger
                    ).decode(Date.self).collect()
                    #expect(sql.first == PeriodMath.add(months: k, to: Self.date(anchor)), "\(anchor) + \(k)")
                }
            }
        }
    }

    @Test("pg_cron's entry point: SELECT * FROM capgate_rollover(at) moves the same companies")
    func sqlRollover() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, _) = try await h.createCompany(plan: "low", users: 0, startedAt: "2026-01-31T00:00:00Z")
            try await h.exec("SELECT * FROM capgate_rollover('2026-03-05T00:00:00Z')")
            let periods = try await Self.periods(h, company)
            #expect(periods.count == 2)
            #expect(periods[1].start == Self.date("2026-02-28T00:00:00Z"))
            #expect(periods[1].end == Self.date("2026-03-31T00:00:00Z"))
            #expect(try await h.scalar("SELECT moved FROM capgate_rollover('2026-03-05T00:00:00Z')") == 0)
        }
    }

    @Test("the server's own schedule (billing.rolloverInterval) rolls an ended period without a request waiting")
    func scheduledRollover() async throws {
        try await Harness.with(settings: ["billing.rolloverInterval": "1"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let start = Timestamp.format(Date().addingTimeInterval(-35 * 86400))
            let (company, users) = try await h.createCompany(plan: "low", users: 1, startedAt: start)
            var rolled = false
            for _ in 0..<40 {
                if try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2 {
                    rolled = true
                    break
                }
                try await Task.sleep(for: .milliseconds(250))
            }
            #expect(rolled)
            #expect(try await h.message(key: users[0].key).status == 200)
        }
    }

    @Test("two rollovers at once: each change happens once")
    func concurrentRollovers() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            for _ in 0..<8 { _ = try await h.createCompany(plan: "low", users: 0, startedAt: "2026-01-01T00:00:00Z") }
            async let a = Self.rollover(h, at: "2026-04-10T00:00:00Z")
            async let b = Self.rollover(h, at: "2026-04-10T00:00:00Z")
            let (x, y) = try await (a, b)
            #expect(x.moved + y.moved == 8)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods") == 16)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE type = 'rollover'") == 8)
        }
    }

    @Test("store events: purchase, renewal, cancel, refund, expire, restore; duplicates and unknown products")
    func storeEvents() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 5, user: 5, isDefault: true)
            try await h.createPlan("low", company: 100, user: 25, sort: 1)
            try await h.createPlan("high", company: 2000, user: nil, sort: 2)
            #expect(
                try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "app.low.monthly", "plan_id": "low", "interval": "month"]))
                    .status == 201)
            #expect(
                try await h.op(
                    .POST, "/admin/v1/products", .obj(["product_id": "app.high.monthly", "plan_id": "high", "interval": "month"])
                ).status == 201)
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            let c = company.text
            func event(
                _ type: String, _ tx: String, product: String? = "app.low.monthly", purchase: Date? = nil, expires: Date? = nil
            ) async throws -> Harness.Reply {
                var fields: [JSON.Field] = [
                    .init("type", .string(type)), .init("company_id", .string(c)), .init("transaction_id", .string(tx)),
                ]
                if let product { fields.append(.init("product_id", .string(product))) }
                if let purchase { fields.append(.init("purchase_date", JSON(purchase))) }
                if let expires { fields.append(.init("expiration_date", JSON(expires))) }
                return try await h.op(.POST, "/admin/v1/billing/events", .object(fields))
            }
            let now = Date()
            let purchase = try await event(
                "purchase", "t1", purchase: now.addingTimeInterval(-60), expires: now.addingTimeInterval(86400 * 30))
            #expect(purchase.status == 201, "\(purchase.body)")
            #expect(purchase.json["company"]?["plan"]?.stringValue == "low")
            let again = try await event(
                "purchase", "t1", purchase: now.addingTimeInterval(-60), expires: now.addingTimeInterval(86400 * 30))
            #expect(again.body == purchase.body)
            #expect(again.status == purchase.status)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE transaction_id = 't1'") == 1)
            // A higher plan mid-period takes effect on the next request.
            _ = try await event("purchase", "t2", product: "app.high.monthly", purchase: now.addingTimeInterval(-1))
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.json["plan"]?["id"]?.stringValue == "high")

            let renewal = try await event("renewal", "t3", product: "app.high.monthly", expires: now.addingTimeInterval(86400 * 60))
            #expect(renewal.status == 201)
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM plan_periods WHERE company_id = '\(c)' AND plan_id = 'high' AND ends_at > now() + interval '59 days'"
                ) == 1)
            let cancel = try await event("cancel", "t4", product: nil)
            #expect(cancel.json["company"]?["auto_renew"]?.boolValue == false)
            #expect(cancel.json["company"]?["plan"]?.stringValue == "high")
            let refund = try await event("refund", "t5", product: nil)
            #expect(refund.json["company"]?["plan"]?.stringValue == "free")
            let restore = try await event("restore", "t6", product: "app.low.monthly")
            #expect(restore.json["company"]?["plan"]?.stringValue == "low")
            let expire = try await event("expire", "t7", product: nil)
            #expect(expire.json["company"]?["plan"]?.stringValue == "free")

            let unknown = try await event("purchase", "t8", product: "app.nope")
            #expect(unknown.status == 404)
            #expect(unknown.json["error"]?["type"]?.stringValue == "not_found_error")
            #expect(unknown.json["error"]?["message"]?.stringValue?.contains("app.nope") == true)
            #expect(try await event("upgrade", "t9").status == 400)
            #expect(
                try await h.op(
                    .POST, "/admin/v1/billing/events",
                    .obj(["type": "cancel", "company_id": .string(UUID().text), "transaction_id": "t10"])
                ).status == 404)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE transaction_id LIKE 't%' AND payload ? 'type'") == 7)

            // A NUL in a field CapGate does not read is kept as U+FFFD in the stored event (jsonb
            // cannot hold it); in a field it reads it is refused, and nothing is stored.
            let odd = try await h.op(
                .POST, "/admin/v1/billing/events",
                .obj(["type": "cancel", "company_id": .string(c), "transaction_id": "n1", "store_note": "a\u{0}b"]))
            #expect(odd.status == 201, "\(odd.body)")
            #expect(try await h.text("SELECT payload->>'store_note' FROM billing_events WHERE transaction_id = 'n1'") == "a\u{FFFD}b")
            let refused = try await h.op(
                .POST, "/admin/v1/billing/events", .obj(["type": "cancel", "company_id": .string(c), "transaction_id": "n2\u{0}"]))
            #expect(refused.status == 400)
            #expect(refused.json["error"]?["message"]?.stringValue?.contains("transaction_id") == true)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE transaction_id LIKE 'n2%'") == 0)
        }
    }

    @Test("a purchase delivered after calls were counted since its purchase_date: they stay in their period, the new one begins now")
    func latePurchase() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 5, user: 5, isDefault: true)
            try await h.createPlan("low", company: 100, user: 25, sort: 1)
            #expect(
                try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "app.low.monthly", "plan_id": "low", "interval": "month"]))
                    .status == 201)
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            for _ in 0..<2 { #expect(try await h.message(key: users[0].key).status == 200) }
            let before = Date()
            let expires = before.addingTimeInterval(86400 * 30)
            func purchase(_ tx: String, at: Date, expires: Date) async throws -> Harness.Reply {
                try await h.op(
                    .POST, "/admin/v1/billing/events",
                    .obj([
                        "type": "purchase", "company_id": .string(company.text), "product_id": "app.low.monthly",
                        "transaction_id": .string(tx), "purchase_date": JSON(at), "expiration_date": JSON(expires),
                    ]))
            }
            // Bought an hour ago (before the company's first period began), delivered now.
            let late = try await purchase("t1", at: before.addingTimeInterval(-3600), expires: expires)
            #expect(late.status == 201, "\(late.body)")
            #expect(late.json["company"]?["plan"]?.stringValue == "low")
            let periods = try await Self.periods(h, company)
            try #require(periods.count == 2)
            #expect(periods[0].plan == "free" && periods[1].plan == "low")
            #expect(periods[0].end == periods[1].start)
            #expect(periods[1].start >= before)
            #expect(abs(periods[1].end.timeIntervalSince(expires)) < 0.001)
            #expect(
                try await h.scalar(
                    """
                    SELECT cu.used FROM company_usage cu JOIN plan_periods pp ON pp.company_id = cu.company_id AND pp.id = cu.period_id
                     WHERE cu.company_id = '\(company.text)' AND pp.plan_id = 'free'
                    """) == 2)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.json["plan"]?["id"]?.stringValue == "low")
            #expect(usage.json["company"]?["used"]?.intValue == 0)

            // A window already over by now, once the counted calls are kept: refused, nothing changes.
            let over = try await purchase("t2", at: before.addingTimeInterval(-7200), expires: before.addingTimeInterval(-3600))
            #expect(over.status == 409)
            #expect(over.json["error"]?["type"]?.stringValue == "conflict_error")
            #expect(try await Self.periods(h, company).count == 2)
            #expect(try await h.scalar("SELECT count(*) FROM billing_events WHERE transaction_id = 't2'") == 0)
        }
    }

    @Test("verify: clean after mixed charges and refunds, a deliberate corruption is reported")
    func verify() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 2)
            for i in 0..<6 {
                let headers = i % 3 == 0 ? [("x-mock-status", "500")] : []
                _ = try await h.message(key: users[i % 2].key, headers: headers)
            }
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            try await h.exec("UPDATE company_usage SET used = used + 3 WHERE company_id = '\(company.text)'")
            let mismatches = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(mismatches.count == 1)
            #expect(mismatches.first?.counter == 7)
            #expect(mismatches.first?.ledger == 4)
        }
    }
}
