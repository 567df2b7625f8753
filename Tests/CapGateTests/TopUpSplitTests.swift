import Foundation
import Testing

@testable import CapGate

/// SPEC §12 "Top-ups" (issue #29): a call the plan can hold only part of is split. The company cap
/// (or company budget) pays what it still holds, the grant only the rest; settlement divides the
/// cost the same way (the plan first, up to its part of the hold); a refund gives each part back
/// to where it came from. One grant per part: a part no single grant can hold is refused.
@Suite("Top-ups: a call is split between the plan and a grant", .timeLimit(.minutes(5)))
struct TopUpSplitTests {
    /// A weighted route: every `POST /v1/messages` costs `units`.
    static func weighted(_ h: Harness, units: Int64) async throws {
        let reply = try await h.op(.POST, "/admin/v1/routes", .obj(["method": "POST", "path": "/v1/messages", "units": .int(units)]))
        precondition(reply.status == 201, "route create failed: \(reply.body)")
    }

    /// The newest charged or refunded row of `company`: units, the grant's part of them (-1: none).
    static func lastParts(_ h: Harness, _ company: UUID) async throws -> (units: Int64, grantPart: Int64) {
        let row = "FROM usage_ledger WHERE company_id = '\(company.text)' ORDER BY id DESC LIMIT 1"
        return (try await h.scalar("SELECT units \(row)"), try await h.scalar("SELECT coalesce(units_grant_part, -1) \(row)"))
    }

    func used(_ h: Harness, _ company: UUID) async throws -> Int64 {
        try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'")
    }

    @Test("a 5-unit call 2 units short of the cap: the plan pays 2, the grant 3; refunds give back both; the rest refused")
    func weightedUnits() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 12, user: nil, isDefault: true)
            try await h.createTopUp("pack.4", units: 4)
            try await Self.weighted(h, units: 5)
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            let bought = try await h.storeEvent("purchase", company: company, product: "pack.4", transaction: "g1")
            #expect(bought.status == 201, "\(bought.body)")
            let key = users[0].key
            for _ in 0..<2 { #expect(try await h.message(key: key).status == 200) }
            #expect(try await used(h, company) == 10)
            // /v1/usage/check decides as admission: 2 from the plan and 3 of the grant's 4 fit, 2 + 5 do not.
            let check = "/v1/usage/check?units="
            #expect(try await h.request(.GET, check + "5", headers: [("x-api-key", key)]).json["allowed"] == true)
            #expect(try await h.request(.GET, check + "7", headers: [("x-api-key", key)]).json["allowed"] == false)

            // 2 units left under the cap: the plan pays them, the grant the other 3.
            #expect(try await h.message(key: key).status == 200)
            #expect(try await used(h, company) == 12)
            #expect(try await h.grant("g1").units == 3)
            #expect(try await Self.lastParts(h, company) == (5, 3))
            // Refunded: each part goes back where it came from.
            try await h.exec(
                "SELECT capgate_refund('\(company.text)', (SELECT max(id) FROM usage_ledger WHERE company_id = '\(company.text)'), 500)")
            #expect(try await used(h, company) == 10)
            #expect(try await h.grant("g1").units == 0)
            // A call the provider fails is split, then refunded the same way by the gateway.
            #expect(try await h.message(key: key, headers: [("x-mock-status", "500")]).status == 500)
            #expect(try await used(h, company) == 10)
            #expect(try await h.grant("g1").units == 0)
            #expect(try await Self.lastParts(h, company) == (5, 3))
            #expect(try await h.message(key: key).status == 200)
            #expect(try await used(h, company) == 12)
            #expect(try await h.grant("g1").units == 3)

            // The grant has 1 left and the cap none: 5 units cannot be paid (no split across grants).
            let refused = try await h.message(key: key)
            #expect(refused.status == 402, "\(refused.body)")
            #expect(try await used(h, company) == 12)
            #expect(try await h.grant("g1").units == 3)
            #expect(try await h.scalar("SELECT sum(used) FROM user_usage WHERE company_id = '\(company.text)'") == 15)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("the batch path splits as the single call does: 5-unit calls in one batch against a cap 2 short")
    func weightedBatch() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 12, user: nil, isDefault: true)
            try await h.createTopUp("pack.4", units: 4)
            let (company, users) = try await h.createCompany(plan: "free", users: 2)
            let bought = try await h.storeEvent("purchase", company: company, product: "pack.4", transaction: "g1")
            #expect(bought.status == 201, "\(bought.body)")
            let items = (0..<4).map { i in
                AdmissionItem(
                    keyHash: nil,
                    request: AdmissionRequest(
                        companyID: company, userID: users[i % 2].id, units: 5, method: "POST", route: "/v1/messages",
                        requestID: "req_batch_\(i)"))
            }
            let rows = try await h.db.withConnection { connection in
                try await connection.execute(AdmitBatchStatement(items: items, relaxed: false), logger: TestCluster.logger).collect()
            }
            #expect(rows.map(\.decision) == [.charged, .charged, .charged, .companyCap])
            #expect(rows.map(\.period.companyUsed) == [5, 10, 12, 12])
            #expect(try await used(h, company) == 12)
            #expect(try await h.grant("g1").units == 3)
            #expect(
                try await h.text(
                    "SELECT string_agg(coalesce(units_grant_part, 0)::text, ',' ORDER BY request_id) FROM usage_ledger") == "0,0,3")
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("64 concurrent 3-unit callers against a cap of 20 and grants of 7 and 12: exactly 39 units admitted")
    func concurrentWeighted() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 20, user: nil, isDefault: true)
            try await h.createTopUp("pack.7", units: 7)
            try await h.createTopUp("pack.12", units: 12)
            try await Self.weighted(h, units: 3)
            let (company, users) = try await h.createCompany(plan: "free", users: 4)
            try await h.buyGrants(company, [("g7", "pack.7", 5), ("g12", "pack.12", 50)])
            let statuses = try await h.concurrentStatuses(keys: users.map(\.key))
            // The plan's 20 (6 calls and 2 units of the 7th), g7's 7 (1 + 3 + 3), g12's 12 (4 calls).
            #expect(statuses.filter { $0 == 200 }.count == 13)
            #expect(statuses.filter { $0 == 402 }.count == 115)
            #expect(try await used(h, company) == 20)
            #expect(try await h.grant("g7").units == 7)
            #expect(try await h.grant("g12").units == 12)
            let ledger = "FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'"
            #expect(try await h.scalar("SELECT sum(units) \(ledger)") == 39)
            #expect(try await h.scalar("SELECT count(*) \(ledger) AND units_grant_part BETWEEN 1 AND units - 1") == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("budget: the company's room holds part of a hold, the grant the rest; the cost is divided plan first; refunds give back both")
    func budgetSplit() async throws {
        try await Harness.with { h in
            try await h.exec(CostBudgetTests.priceRow)
            try await h.createPlan("p", company: nil, user: nil, isDefault: true)
            let body = CostBudgetTests.body(maxTokens: 1_000)
            let hold = CostBudgetTests.hold(body, maxTokens: 1_000)
            let room = hold / 3
            try await h.exec("UPDATE plans SET monthly_company_budget = \(room) WHERE id = 'p'")
            try await h.createTopUp("pack.cash", units: nil, budget: Micros(hold * 4).decimal)
            // Settled below the plan's part, between it and the hold, past the whole hold.
            for (n, usage) in [(100, 100), (1_000, 500), (1_000, 2_000)].enumerated() {
                let (company, users) = try await h.createCompany(plan: "p", users: 1)
                let where_ = "WHERE company_id = '\(company.text)'"
                #expect(try await h.storeEvent("purchase", company: company, product: "pack.cash", transaction: "cash-\(n)").status == 201)
                let mockUsage = #"{"input_tokens":\#(usage.0),"output_tokens":\#(usage.1)}"#
                #expect(try await Self.call(h, users[0].key, body, [("x-mock-usage", mockUsage)]).status == 200)
                #expect(try await h.scalar("SELECT cost_grant_part FROM usage_ledger \(where_)") == hold - room)
                _ = try await h.eventually("SELECT count(*) FROM usage_ledger \(where_) AND cost_source IS NOT NULL", equals: 1)
                let cost = Int64(usage.0 * 3 + usage.1 * 15)
                #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger \(where_)") == cost)
                let plan = min(cost, room)
                #expect(try await h.scalar("SELECT cost_used FROM company_usage \(where_)") == plan, "case \(n)")
                #expect(try await h.scalar("SELECT cost_held FROM company_usage \(where_)") == 0)
                #expect(try await h.grant("cash-\(n)") == (0, cost - plan, 0), "case \(n)")
                // The settled call refunded: the plan and the grant each get back what they paid.
                try await h.exec("SELECT capgate_refund('\(company.text)', (SELECT id FROM usage_ledger \(where_)), 500)")
                #expect(try await h.scalar("SELECT cost_used + cost_held FROM company_usage \(where_)") == 0)
                #expect(try await h.grant("cash-\(n)") == (0, 0, 0))
            }

            // While the call is in flight: the company holds its room, the grant the rest; a
            // provider failure gives both back.
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            #expect(try await h.storeEvent("purchase", company: company, product: "pack.cash", transaction: "cash-open").status == 201)
            let slow = Task { try await Self.call(h, users[0].key, body, [("x-mock-delay-ms", "1500"), ("x-mock-status", "500")]) }
            let counter = "SELECT cost_held FROM company_usage WHERE company_id = '\(company.text)'"
            #expect(try await h.eventually(counter, equals: room) == room)
            #expect(try await h.grant("cash-open") == (0, 0, hold - room))
            #expect(try await slow.value.status == 500)
            #expect(try await h.eventually(counter, equals: 0) == 0)
            #expect(try await h.grant("cash-open") == (0, 0, 0))
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("capgate unsettled keep of a split hold: the plan's part becomes the plan's cost, the grant's part the grant's")
    func keepSplitHold() async throws {
        try await Harness.with { h in
            try await h.exec(CostBudgetTests.priceRow)
            try await h.createPlan("p", company: nil, user: nil, isDefault: true)
            try await h.exec("UPDATE plans SET monthly_company_budget = 6000 WHERE id = 'p'")
            try await h.createTopUp("pack.cash", units: nil, budget: "1")
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            #expect(try await h.storeEvent("purchase", company: company, product: "pack.cash", transaction: "cash-1").status == 201)
            // Admitted and never settled, as a gateway that died would leave it.
            let id = try await h.scalar(
                """
                SELECT (capgate_charge('\(company.text)', '\(users[0].id.text)', 1, 'POST', '/v1/messages', 'claude-test', NULL,
                                       'req_stranded', NULL, now(), NULL, 1000, 1000, 0::smallint, 0)).ledger_id
                """)
            let row = "FROM usage_ledger WHERE id = \(id)"
            let hold = try await h.scalar("SELECT hold_micros \(row)")
            #expect(hold > 6000)
            #expect(try await h.scalar("SELECT cost_grant_part \(row)") == hold - 6000)
            #expect(try await h.grant("cash-1") == (0, 0, hold - 6000))
            let kept = try await CapGateRunner.unsettledKeep(
                url: h.databaseURL, ids: [id], company: company, olderThan: 0, logger: TestCluster.logger)
            #expect(kept.map(\.outcome) == [.kept])
            let counter = "FROM company_usage WHERE company_id = '\(company.text)'"
            #expect(try await h.scalar("SELECT cost_used \(counter)") == 6000)
            #expect(try await h.scalar("SELECT cost_held \(counter)") == 0)
            #expect(try await h.grant("cash-1") == (0, hold - 6000, 0))
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    static func call(_ h: Harness, _ key: String, _ body: String, _ headers: [(String, String)]) async throws -> Harness.Reply {
        try await h.request(
            .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")] + headers, body: body)
    }
}
