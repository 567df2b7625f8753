import CapGate
import Foundation
import Testing

/// SPEC §12 "Top-ups" in admission, through the real gateway and PostgreSQL: grants pay only
/// what the plan's company cap or budget cannot hold, oldest expiry first; refunds give back to
/// the grant; exact under many concurrent callers.
@Suite("Top-ups: admission draws on grants", .timeLimit(.minutes(5)))
struct TopUpAdmissionTests {
    @Test("oldest expiry first, expired and refunded grants ignored; a refunded call goes back to its grant; /v1/usage/check counts grants")
    func drawOrder() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 2, user: nil, isDefault: true)
            try await h.createTopUp("pack.3", units: 3)
            try await h.createTopUp("pack.2", units: 2)
            try await h.createTopUp("pack.100", units: 100)
            let (company, users) = try await h.createCompany(plan: "free", users: 2)
            let now = Date()
            for (type, tx, product, purchase, expiration) in [
                ("purchase", "late", "pack.3", now - 60, now + 86_400 * 30),
                ("purchase", "soon", "pack.2", now - 60, now + 86_400 * 10),
                ("purchase", "expired", "pack.100", now - 86_400 * 400, nil),
                ("purchase", "gone", "pack.100", now - 60, now + 86_400),
            ] {
                let reply = try await h.storeEvent(
                    type, company: company, product: product, transaction: tx, purchase: purchase, expiration: expiration)
                #expect(reply.status == 201, "\(reply.body)")
            }
            let refund = try await h.storeEvent("refund", company: company, product: "pack.100", transaction: "gone-r", original: "gone")
            #expect(refund.status == 201 && refund.json["grant"]?["status"]?.stringValue == "refunded", "\(refund.body)")

            let keys = users.map { [("x-api-key", $0.key)] }
            for i in 0..<2 { #expect(try await h.message(key: users[i].key).status == 200) }
            #expect(try await h.request(.GET, "/v1/usage/check?units=2", headers: keys[0]).json["allowed"] == true)
            #expect(try await h.request(.GET, "/v1/usage/check?units=4", headers: keys[0]).json["allowed"] == false)
            // Paid by 'soon', then refunded (the provider failed): back to 'soon'.
            #expect(try await h.message(key: users[0].key, headers: [("x-mock-status", "500")]).status == 500)
            #expect(try await h.grant("soon").units == 0)
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM usage_ledger l JOIN topup_grants g ON g.id = l.units_grant_id WHERE l.outcome = 'refunded' AND g.transaction_id = 'soon'"
                ) == 1)
            for i in 0..<5 { #expect(try await h.message(key: users[i % 2].key).status == 200, "call \(i)") }
            let refused = try await h.message(key: users[1].key)
            #expect(refused.status == 402 && refused.json["error"]?["type"]?.stringValue == "usage_cap_exceeded", "\(refused.body)")
            #expect(try await h.unitPayers(company) == ["plan", "plan", "soon", "soon", "late", "late", "late"])
            #expect(try await h.grant("expired").units == 0)
            #expect(try await h.grant("gone").units == 0)
            // The plan's counter holds only what the plan paid; the users' hold every call.
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
            #expect(try await h.scalar("SELECT sum(used) FROM user_usage WHERE company_id = '\(company.text)'") == 7)
            #expect(try await h.request(.GET, "/v1/usage/check?units=1", headers: keys[0]).json["allowed"] == false)
            let grants = try await h.request(.GET, "/v1/usage", headers: keys[1]).json["grants"]?.arrayValue ?? []
            #expect(grants.compactMap { $0["status"]?.stringValue } == ["expired", "refunded", "used_up", "used_up"])
            // A refund of a plan-paid call gives the plan room again, before any grant.
            try await h.exec(
                "SELECT capgate_refund('\(company.text)', (SELECT min(id) FROM usage_ledger WHERE company_id = '\(company.text)'), 500)")
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.unitPayers(company).last == "plan")
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("64 concurrent callers drain the company cap, then two grants: exactly cap + grants are admitted")
    func concurrentUnits() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 20, user: nil, isDefault: true)
            try await h.createTopUp("pack.15", units: 15)
            let (company, users) = try await h.createCompany(plan: "free", users: 4)
            try await h.buyGrants(company, [("g1", "pack.15", 5), ("g2", "pack.15", 50)])
            let statuses = try await h.concurrentStatuses(keys: users.map(\.key))
            #expect(statuses.filter { $0 == 200 }.count == 50)
            #expect(statuses.filter { $0 == 402 }.count == 78)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 20)
            #expect(try await h.grant("g1").units == 15)
            #expect(try await h.grant("g2").units == 15)
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'") == 50)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("budget grants: a hold the company budget cannot take is held on the grant and settled there; never past either; 32 at once")
    func budget() async throws {
        try await Harness.with { h in
            try await h.exec(CostBudgetTests.priceRow)
            try await h.createPlan("p", company: nil, user: nil, isDefault: true)
            let body = CostBudgetTests.body()
            let hold = CostBudgetTests.hold(body)
            // Room for 2 holds on the plan and 5 on the pack.
            try await h.exec("UPDATE plans SET monthly_company_budget = \(hold * 2) WHERE id = 'p'")
            try await h.createTopUp("pack.cash", units: nil, budget: Micros(hold * 5).decimal)
            let (company, users) = try await h.createCompany(plan: "p", users: 4)
            let reply = try await h.storeEvent("purchase", company: company, product: "pack.cash", transaction: "cash-1")
            #expect(reply.status == 201, "\(reply.body)")
            func call(_ key: String, _ headers: [(String, String)] = []) async throws -> Harness.Reply {
                try await h.request(
                    .POST, "/v1/messages",
                    headers: [("x-api-key", key), ("content-type", "application/json")] + headers, body: body)
            }
            // A failed call held on the grant gives its hold back to the grant.
            for _ in 0..<2 { #expect(try await call(users[0].key).status == 200) }
            _ = try await h.eventually("SELECT cost_held FROM company_usage WHERE company_id = '\(company.text)'", equals: 0)
            let spent = try await h.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(company.text)'")
            try await h.exec("UPDATE plans SET monthly_company_budget = \(spent) WHERE id = 'p'")
            #expect(try await call(users[0].key, [("x-mock-status", "500")]).status == 500)
            let afterRefund = try await h.grant("cash-1")
            #expect(afterRefund.held == 0 && afterRefund.cost == 0)

            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for i in 0..<32 { group.addTask { try await call(users[i % 4].key).status } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let admitted = statuses.filter { $0 == 200 }.count
            #expect(admitted >= 5 && statuses.allSatisfy { $0 == 200 || $0 == 402 }, "\(statuses)")
            _ = try await h.eventually("SELECT cost_held FROM topup_grants WHERE transaction_id = 'cash-1'", equals: 0)
            let grant = try await h.grant("cash-1")
            #expect(grant.cost > 0 && grant.cost <= hold * 5, "\(grant)")
            #expect(try await h.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(company.text)'") == spent)
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE cost_grant_id IS NOT NULL AND outcome = 'charged'") == admitted)
            let read = try await h.op(.GET, "/admin/v1/companies/\(company.text)/usage").json["grants"]?.arrayValue?.first ?? .null
            #expect(
                read["granted"]?["budget"]?.stringValue == Micros(hold * 5).decimal
                    && read["used"]?["budget"]?.stringValue == Micros(grant.cost).decimal)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }
}
