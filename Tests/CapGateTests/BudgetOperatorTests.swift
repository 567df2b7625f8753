import CapGate
import Foundation
import Testing

/// SPEC §11 on the operator's side: budgets on plans and users through the API (exact decimal
/// strings, `null` unlimited, 400 and nothing changed on bad input), `capgate verify`'s cost
/// counters, and `capgate unsettled keep` charging an open hold.
@Suite("Cost budgets: operator API, verify, unsettled keep", .timeLimit(.minutes(5)))
struct BudgetOperatorTests {
    /// Values that must be refused, each with what it shows.
    static let badBudgets: [JSON] = [
        .int(5), .double(12.5), .string("-1"), .string("1.0000001"), .string("1e3"), .string("abc"), .string("1000000000"),
        .string(""), .string("05"), .bool(true),
    ]

    @Test("plans take, keep and show monthly_company_budget and monthly_user_budget exactly; bad values are 400")
    func plans() async throws {
        try await Harness.with { h in
            let created = try await h.op(
                .POST, "/admin/v1/plans",
                .obj(["id": "b", "name": "B", "monthly_company_budget": "0.000001", "monthly_user_budget": "12.5"]))
            #expect(created.status == 201, "\(created.body)")
            #expect(created.json["monthly_company_budget"]?.stringValue == "0.000001")
            #expect(created.json["monthly_user_budget"]?.stringValue == "12.5")
            #expect(try await h.scalar("SELECT monthly_company_budget FROM plans WHERE id = 'b'") == 1)
            #expect(try await h.scalar("SELECT monthly_user_budget FROM plans WHERE id = 'b'") == 12_500_000)
            let read = try await h.op(.GET, "/admin/v1/plans/b")
            #expect(read.json["monthly_company_budget"]?.stringValue == "0.000001")
            #expect(read.json["monthly_user_budget"]?.stringValue == "12.5")

            let plain = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "plain", "name": "Plain"]))
            #expect(plain.json["monthly_company_budget"]?.isNull == true && plain.json["monthly_user_budget"]?.isNull == true)
            let listed = try await h.op(.GET, "/admin/v1/plans").json["data"]?.arrayValue ?? []
            #expect(listed.count == 2)
            #expect(listed.first { $0["id"]?.stringValue == "b" }?["monthly_user_budget"]?.stringValue == "12.5")
            #expect(listed.first { $0["id"]?.stringValue == "plain" }?["monthly_user_budget"]?.isNull == true)

            // Left out: unchanged; a new value; trailing zeros shown in the shortest form; null: unlimited.
            let renamed = try await h.op(.PUT, "/admin/v1/plans/b", .obj(["name": "B2"]))
            #expect(renamed.status == 200)
            #expect(renamed.json["monthly_company_budget"]?.stringValue == "0.000001")
            #expect(renamed.json["monthly_user_budget"]?.stringValue == "12.5")
            let bigger = try await h.op(.PUT, "/admin/v1/plans/b", .obj(["monthly_user_budget": "1000000"]))
            #expect(bigger.json["monthly_user_budget"]?.stringValue == "1000000")
            #expect(bigger.json["monthly_company_budget"]?.stringValue == "0.000001")
            let padded = try await h.op(.PUT, "/admin/v1/plans/b", .obj(["monthly_company_budget": "1.500000"]))
            #expect(padded.json["monthly_company_budget"]?.stringValue == "1.5")
            let unlimited = try await h.op(.PUT, "/admin/v1/plans/b", .obj(["monthly_company_budget": .null]))
            #expect(unlimited.json["monthly_company_budget"]?.isNull == true)
            #expect(unlimited.json["monthly_user_budget"]?.stringValue == "1000000")
            #expect(try await h.scalar("SELECT count(*) FROM plans WHERE id = 'b' AND monthly_company_budget IS NULL") == 1)

            for bad in Self.badBudgets {
                for field in ["monthly_company_budget", "monthly_user_budget"] {
                    let put = try await h.op(.PUT, "/admin/v1/plans/b", .obj(["name": "Changed", field: bad]))
                    #expect(put.status == 400, "\(field) \(bad.serialized()) → \(put.body)")
                    #expect(put.json["type"]?.stringValue == "error")
                    #expect(put.json["error"]?["type"]?.stringValue == "invalid_request_error")
                    #expect(put.json["error"]?["message"]?.stringValue?.contains("'\(field)'") == true, "\(put.body)")
                    let post = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "x", "name": "X", field: bad]))
                    #expect(post.status == 400, "\(field) \(bad.serialized()) → \(post.body)")
                }
            }
            let after = try await h.op(.GET, "/admin/v1/plans/b")
            #expect(after.json["name"]?.stringValue == "B2")
            #expect(after.json["monthly_company_budget"]?.isNull == true)
            #expect(after.json["monthly_user_budget"]?.stringValue == "1000000")
            #expect(try await h.scalar("SELECT count(*) FROM plans WHERE id = 'x'") == 0)
        }
    }

    @Test("users take, keep and show monthly_budget exactly; bad values are 400 and change nothing")
    func users() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, _) = try await h.createCompany(plan: "low", users: 0)
            let users = "/admin/v1/companies/\(company.text)/users"
            let made = try await h.op(.POST, users, .obj(["email": "b@acme.test", "monthly_budget": "12.345678"]))
            #expect(made.status == 201, "\(made.body)")
            #expect(made.json["monthly_budget"]?.stringValue == "12.345678")
            let id = try #require(made.json["id"]?.stringValue)
            #expect(try await h.scalar("SELECT monthly_budget FROM users WHERE id = '\(id)'") == 12_345_678)
            let plain = try await h.op(.POST, users, .obj(["email": "c@acme.test"]))
            #expect(plain.json["monthly_budget"]?.isNull == true)
            let explicitNull = try await h.op(.POST, users, .obj(["email": "d@acme.test", "monthly_budget": .null]))
            #expect(explicitNull.status == 201 && explicitNull.json["monthly_budget"]?.isNull == true)

            let user = "\(users)/\(id)"
            let role = try await h.op(.PATCH, user, .obj(["role": "admin"]))
            #expect(role.status == 200)
            #expect(role.json["monthly_budget"]?.stringValue == "12.345678")
            #expect(try await h.op(.PATCH, user, .obj(["monthly_budget": "0"])).json["monthly_budget"]?.stringValue == "0")
            #expect(try await h.op(.PATCH, user, .obj(["monthly_budget": "12.50"])).json["monthly_budget"]?.stringValue == "12.5")
            let listed = try await h.op(.GET, users).json["data"]?.arrayValue ?? []
            #expect(listed.first { $0["id"]?.stringValue == id }?["monthly_budget"]?.stringValue == "12.5")

            for bad in Self.badBudgets {
                let patch = try await h.op(.PATCH, user, .obj(["role": "member", "monthly_budget": bad]))
                #expect(patch.status == 400, "\(bad.serialized()) → \(patch.body)")
                #expect(patch.json["error"]?["message"]?.stringValue?.contains("'monthly_budget'") == true, "\(patch.body)")
                let post = try await h.op(.POST, users, .obj(["email": "bad@acme.test", "monthly_budget": bad]))
                #expect(post.status == 400, "\(bad.serialized()) → \(post.body)")
            }
            let kept = try await h.op(.GET, users).json["data"]?.arrayValue?.first { $0["id"]?.stringValue == id }
            #expect(kept?["role"]?.stringValue == "admin")
            #expect(kept?["monthly_budget"]?.stringValue == "12.5")
            #expect(try await h.scalar("SELECT count(*) FROM users WHERE email = 'bad@acme.test'") == 0)

            let removed = try await h.op(.PATCH, user, .obj(["monthly_budget": .null]))
            #expect(removed.json["monthly_budget"]?.isNull == true)
            #expect(try await h.scalar("SELECT count(*) FROM users WHERE id = '\(id)' AND monthly_budget IS NULL") == 1)
            // The billing overview still lists the company.
            #expect(try await h.op(.GET, "/admin/v1/companies").status == 200)
        }
    }

    /// Clears every cost column of the company's ledger rows and counters, so a test sets exactly
    /// the costs it checks (whatever the admission wrote for its calls).
    static func clearCosts(_ h: Harness, company: UUID) async throws {
        try await h.exec(
            """
            UPDATE usage_ledger SET hold_micros = NULL, cost_micros = NULL, cost_source = NULL WHERE company_id = '\(company.text)';
            UPDATE company_usage SET cost_used = 0, cost_held = 0 WHERE company_id = '\(company.text)';
            UPDATE user_usage SET cost_used = 0, cost_held = 0 WHERE company_id = '\(company.text)';
            """)
    }

    /// The company's charged (or refunded) ledger ids of one user, oldest first.
    static func ledgerIDs(_ h: Harness, company: UUID, user: UUID, outcome: String = "charged") async throws -> [Int64] {
        let count = try await h.scalar(
            "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND user_id = '\(user.text)' AND outcome = '\(outcome)'"
        )
        var ids: [Int64] = []
        for i in 0..<count {
            ids.append(
                try await h.scalar(
                    """
                    SELECT id FROM usage_ledger WHERE company_id = '\(company.text)' AND user_id = '\(user.text)' AND outcome = '\(outcome)'
                     ORDER BY id OFFSET \(i) LIMIT 1
                    """))
        }
        return ids
    }

    @Test("verify recomputes cost_used and cost_held from the ledger; a corrupted one is reported (exit 1)")
    func verify() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 2)
            for i in 0..<5 {
                let headers = i == 4 ? [("x-mock-status", "500")] : []
                #expect(try await h.message(key: users[i % 2].key, headers: headers).status == (i == 4 ? 500 : 200))
            }
            _ = try await h.eventually(
                "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND settled_at IS NOT NULL", equals: 5)
            try await Self.clearCosts(h, company: company)
            let first = try await Self.ledgerIDs(h, company: company, user: users[0].id)
            let second = try await Self.ledgerIDs(h, company: company, user: users[1].id)
            let refunded = try await Self.ledgerIDs(h, company: company, user: users[0].id, outcome: "refunded")
            try #require(first.count >= 2 && second.count == 2 && refunded.count == 1)
            let c = company.text
            // user 0: a settled call (hold 500, cost 300) and an open hold of 700; user 1: a call
            // charged its hold (1000); a refunded row's open hold counts nothing.
            try await h.exec(
                """
                UPDATE usage_ledger SET hold_micros = 500, cost_micros = 300, cost_source = 'usage' WHERE company_id = '\(c)' AND id = \(first[0]);
                UPDATE usage_ledger SET hold_micros = 700 WHERE company_id = '\(c)' AND id = \(first[1]);
                UPDATE usage_ledger SET hold_micros = 1000, cost_micros = 1000, cost_source = 'hold' WHERE company_id = '\(c)' AND id = \(second[0]);
                UPDATE usage_ledger SET hold_micros = 9999 WHERE company_id = '\(c)' AND id = \(refunded[0]);
                UPDATE company_usage SET cost_used = 1300, cost_held = 700 WHERE company_id = '\(c)';
                UPDATE user_usage SET cost_used = 300, cost_held = 700 WHERE company_id = '\(c)' AND user_id = '\(users[0].id.text)';
                UPDATE user_usage SET cost_used = 1000 WHERE company_id = '\(c)' AND user_id = '\(users[1].id.text)';
                """)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            let clean = try await CapGateRunner.verifyReport(url: h.databaseURL, logger: TestCluster.logger)
            #expect(clean.exitCode(strictUnsettled: false) == 0)

            try await h.exec("UPDATE company_usage SET cost_held = cost_held + 5 WHERE company_id = '\(c)'")
            let held = try await CapGateRunner.verifyReport(url: h.databaseURL, logger: TestCluster.logger)
            #expect(held.mismatches.count == 1)
            let mismatch = try #require(held.mismatches.first)
            #expect(mismatch.measure == .costHeld && mismatch.userID == nil && mismatch.companyID == company)
            #expect(mismatch.counter == 705 && mismatch.ledger == 700)
            #expect(mismatch.description.hasSuffix("company: cost_held: counter 0.000705 USD, ledger 0.0007 USD"), "\(mismatch)")
            #expect(held.exitCode(strictUnsettled: false) == 1)
            #expect(held.lines.contains("1 mismatches"))

            try await h.exec(
                """
                UPDATE company_usage SET cost_held = 700 WHERE company_id = '\(c)';
                UPDATE user_usage SET cost_used = 0 WHERE company_id = '\(c)' AND user_id = '\(users[1].id.text)';
                """)
            let used = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(used.count == 1)
            #expect(used.first?.measure == .costUsed && used.first?.userID == users[1].id)
            #expect(used.first?.counter == 0 && used.first?.ledger == 1000)

            // A settled cost changed in the ledger alone is reported for the company and the user.
            try await h.exec(
                """
                UPDATE user_usage SET cost_used = 1000 WHERE company_id = '\(c)' AND user_id = '\(users[1].id.text)';
                UPDATE usage_ledger SET cost_micros = 301 WHERE company_id = '\(c)' AND id = \(first[0]);
                """)
            let ledger = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(ledger.count == 2)
            #expect(ledger.allSatisfy { $0.measure == .costUsed && $0.ledger == $0.counter + 1 })
            #expect(Set(ledger.map(\.userID)) == [nil, users[0].id])
        }
    }

    @Test("unsettled keep charges an open hold: cost = hold, cost_source 'hold', moved from held to used in both counters")
    func keepChargesHold() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let user = users[0].id
            for _ in 0..<3 { #expect(try await h.message(key: users[0].key).status == 200) }
            let c = company.text
            _ = try await h.eventually(
                "SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND settled_at IS NOT NULL", equals: 3)
            try await Self.clearCosts(h, company: company)
            let ids = try await Self.ledgerIDs(h, company: company, user: user)
            try #require(ids.count == 3)
            let (held, unpriced, settled) = (ids[0], ids[1], ids[2])
            // Two calls whose gateway died (one holding 2.5 USD, one with nothing held), and one
            // settled call (cost 0.25 of a 1 USD hold).
            try await h.exec(
                """
                UPDATE usage_ledger SET settled_at = NULL, upstream_status = NULL, hold_micros = 2500000
                 WHERE company_id = '\(c)' AND id = \(held);
                UPDATE usage_ledger SET settled_at = NULL, upstream_status = NULL WHERE company_id = '\(c)' AND id = \(unpriced);
                UPDATE usage_ledger SET hold_micros = 1000000, cost_micros = 250000, cost_source = 'usage'
                 WHERE company_id = '\(c)' AND id = \(settled);
                UPDATE company_usage SET cost_held = 2500000, cost_used = 250000 WHERE company_id = '\(c)';
                UPDATE user_usage SET cost_held = 2500000, cost_used = 250000 WHERE company_id = '\(c)';
                """)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            let listed = try await CapGateRunner.unsettledList(
                url: h.databaseURL, company: company, olderThan: 0, logger: TestCluster.logger)
            #expect(listed.map(\.id) == [held, unpriced])
            #expect(listed.map(\.hold) == [Micros(2_500_000), nil])
            #expect(listed.first?.description.hasSuffix(" hold 2.5 USD") == true)
            let report = try await CapGateRunner.verifyReport(url: h.databaseURL, unsettledAfter: 0, logger: TestCluster.logger)
            #expect(report.unsettled.first?.held == Micros(2_500_000))
            #expect(report.unsettled.first?.description.hasSuffix(", 2.5 USD held") == true)

            let kept = try await CapGateRunner.unsettledKeep(
                url: h.databaseURL, ids: [held, unpriced, settled], company: company, olderThan: 0, logger: TestCluster.logger)
            #expect(kept.map(\.outcome) == [.kept, .kept, .skipped("settled by the provider (status 200)")])
            #expect(kept.map(\.charged) == [Micros(2_500_000), nil, nil])
            #expect(kept.first?.description.hasSuffix("the charge stands, its hold of 2.5 USD charged") == true)

            func column(_ name: String, _ id: Int64) -> String {
                "SELECT \(name) FROM usage_ledger WHERE company_id = '\(c)' AND id = \(id)"
            }
            #expect(try await h.scalar(column("cost_micros", held)) == 2_500_000)
            #expect(try await h.text(column("cost_source", held)) == "hold")
            #expect(try await h.text(column("settled_at IS NOT NULL", held)) == "true")
            #expect(try await h.text(column("cost_source", unpriced)) == nil)
            #expect(try await h.text(column("cost_micros", unpriced)) == nil)
            #expect(try await h.text(column("settled_at IS NOT NULL", unpriced)) == "true")
            for table in ["company_usage", "user_usage"] {
                #expect(try await h.scalar("SELECT sum(cost_held) FROM \(table) WHERE company_id = '\(c)'") == 0)
                #expect(try await h.scalar("SELECT sum(cost_used) FROM \(table) WHERE company_id = '\(c)'") == 2_750_000)
                #expect(try await h.scalar("SELECT sum(used) FROM \(table) WHERE company_id = '\(c)'") == 3)
            }
            let after = try await CapGateRunner.verifyReport(url: h.databaseURL, unsettledAfter: 0, logger: TestCluster.logger)
            #expect(after.mismatches.isEmpty && after.unsettled.isEmpty)

            // Again: nothing moves twice.
            let again = try await CapGateRunner.unsettledKeep(
                url: h.databaseURL, ids: [held], company: company, olderThan: 0, logger: TestCluster.logger)
            #expect(again.map(\.outcome) == [.already("kept")])
            #expect(try await h.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(c)'") == 2_750_000)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }
}
