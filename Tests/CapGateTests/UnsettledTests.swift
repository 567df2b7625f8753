import CapGate
import Foundation
import Testing

/// Issue #20 item 4: a charge whose gateway died before the provider answered is reported by
/// `verify`, marked in the events export, and resolved by `capgate unsettled keep|refund`.
@Suite("Unsettled charges", .timeLimit(.minutes(5)))
struct UnsettledTests {
    /// A charge admitted `hoursAgo` hours ago and never settled, as a gateway that died would
    /// leave it; returns its ledger id.
    static func strandedCharge(
        _ h: Harness, company: UUID, user: UUID, hoursAgo: Double, idempotencyKey: String? = nil
    ) async throws
        -> Int64
    {
        let at = "now() - interval '\(Int(hoursAgo * 3600)) seconds'"
        if let idempotencyKey {
            return try await h.scalar(
                """
                SELECT ledger_id FROM capgate_admit_idempotent(NULL, '\(company.text)', '\(user.text)', 1, 'POST', '/v1/messages',
                       NULL, NULL, 'req_\(idempotencyKey)', '\(idempotencyKey)', '\\x01'::bytea, NULL, \(at), false, -2, -1, 0::smallint, 0)
                """)
        }
        return try await h.scalar(
            """
            SELECT (capgate_charge('\(company.text)', '\(user.text)', 1, 'POST', '/v1/messages', NULL, NULL,
                                  'req_\(UUID().uuidString.prefix(8))', NULL, \(at))).ledger_id
            """)
    }

    /// The events export (JSON) by ledger id.
    static func events(_ h: Harness, company: UUID) async throws -> [Int64: JSON] {
        let rows = try await h.op(.GET, "/admin/v1/companies/\(company.text)/events?limit=1000").json["data"]?.arrayValue ?? []
        var out: [Int64: JSON] = [:]
        for row in rows { if let id = row["id"]?.intValue { out[id] = row } }
        return out
    }

    static func csvSettlement(_ h: Harness, company: UUID) async throws -> [Int64: String] {
        let csv = try await h.request(.GET, "/admin/v1/companies/\(company.text)/events", headers: h.asOperator + [("accept", "text/csv")])
        let rows = EdgeHardeningTests.parseCSV(csv.body)
        let header = rows.first ?? []
        guard let id = header.firstIndex(of: "id"), let settlement = header.firstIndex(of: "settlement") else { return [:] }
        var out: [Int64: String] = [:]
        for row in rows.dropFirst() where row.count == header.count { out[Int64(row[id]) ?? -1] = row[settlement] }
        return out
    }

    @Test("verify reports unsettled charges per company (exit 1 only when strict); the export marks them; refund gives them back")
    func reportAndRefund() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let yesterday = Timestamp.format(Date().addingTimeInterval(-86_400))
            let (company, users) = try await h.createCompany(plan: "low", users: 1, startedAt: yesterday)
            let (other, _) = try await h.createCompany(plan: "low", users: 1, startedAt: yesterday)
            let user = users[0].id
            #expect(try await h.message(key: users[0].key).status == 200)
            let oldest = try await Self.strandedCharge(h, company: company, user: user, hoursAgo: 3)
            let keyed = try await Self.strandedCharge(h, company: company, user: user, hoursAgo: 2, idempotencyKey: "stranded-1")
            let fresh = try await Self.strandedCharge(h, company: company, user: user, hoursAgo: 0)
            let counter = "SELECT sum(used) FROM company_usage WHERE company_id = '\(company.text)'"
            let userCounter = "SELECT sum(used) FROM user_usage WHERE company_id = '\(company.text)'"
            #expect(try await h.scalar(counter) == 4)

            let report = try await CapGateRunner.verifyReport(url: h.databaseURL, logger: TestCluster.logger)
            #expect(report.mismatches.isEmpty)
            #expect(report.unsettled.count == 1)
            #expect(report.unsettled.first?.companyID == company)
            #expect(report.unsettled.first?.count == 2)
            #expect(report.unsettled.first?.units == 2)
            #expect(report.unsettled.first?.oldestID == oldest)
            #expect(report.exitCode(strictUnsettled: false) == 0)
            #expect(report.exitCode(strictUnsettled: true) == 1)
            #expect(report.lines.contains { $0.hasPrefix("unsettled: company \(company.text): 2 charges, 2 units, oldest \(oldest) at ") })
            let zero = try await CapGateRunner.verifyReport(url: h.databaseURL, unsettledAfter: 0, logger: TestCluster.logger)
            #expect(zero.unsettled.first?.count == 3)
            #expect(!zero.unsettled.contains { $0.companyID == other })

            let events = try await Self.events(h, company: company)
            #expect(events[oldest]?["settlement"]?.stringValue == "unsettled")
            #expect(events[keyed]?["settlement"]?.stringValue == "unsettled")
            #expect(events[fresh]?["settlement"]?.stringValue == "pending")
            #expect(events.values.filter { $0["settlement"]?.stringValue == "settled" }.count == 1)
            let csv = try await Self.csvSettlement(h, company: company)
            #expect(csv[oldest] == "unsettled" && csv[keyed] == "unsettled" && csv[fresh] == "pending")

            let listed = try await CapGateRunner.unsettledList(url: h.databaseURL, company: company, logger: TestCluster.logger)
            #expect(listed.map(\.id) == [oldest, keyed])
            #expect(listed.last?.idempotencyKey == "stranded-1")
            #expect(try await CapGateRunner.unsettledList(url: h.databaseURL, company: other, logger: TestCluster.logger).isEmpty)

            // A pending charge may still be answered: not touched unless asked with --older-than.
            let pending = try await CapGateRunner.unsettledRefund(url: h.databaseURL, ids: [fresh], logger: TestCluster.logger)
            #expect(pending.first?.done == false)
            #expect(pending.first?.description.contains("pending") == true)
            let refunded = try await CapGateRunner.unsettledRefund(
                url: h.databaseURL, ids: [oldest, keyed, 987_654_321], logger: TestCluster.logger)
            #expect(
                refunded.map(\.outcome) == [
                    .refunded, .refunded, .skipped("no ledger row with this id (none was written, or its month was dropped by retention)"),
                ])
            #expect(try await h.scalar(counter) == 2)
            #expect(try await h.scalar(userCounter) == 2)
            #expect(try await h.text("SELECT state FROM idempotency_keys WHERE key = 'stranded-1'") == "failed")
            let after = try await CapGateRunner.verifyReport(url: h.databaseURL, logger: TestCluster.logger)
            #expect(after.mismatches.isEmpty && after.unsettled.isEmpty)
            #expect(after.exitCode(strictUnsettled: true) == 0)
            let again = try await CapGateRunner.unsettledRefund(url: h.databaseURL, ids: [oldest], logger: TestCluster.logger)
            #expect(again.first?.outcome == .already("refunded") && again.first?.done == true)
            #expect(try await h.scalar(counter) == 2)
            let settled = try await Self.events(h, company: company)
            #expect(settled[oldest]?["outcome"]?.stringValue == "refunded")
            #expect(settled[oldest]?["settlement"]?.stringValue == "settled")
            #expect(settled[fresh]?["settlement"]?.stringValue == "pending")
        }
    }

    @Test("keep: the charge stands (counters unchanged), is shown as kept and no longer reported")
    func keep() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (company, users) = try await h.createCompany(
                plan: "low", users: 1, startedAt: Timestamp.format(Date().addingTimeInterval(-86_400)))
            let stranded = try await Self.strandedCharge(h, company: company, user: users[0].id, hoursAgo: 2)
            let counter = "SELECT sum(used) FROM company_usage WHERE company_id = '\(company.text)'"
            #expect(try await h.scalar(counter) == 1)
            let kept = try await CapGateRunner.unsettledKeep(
                url: h.databaseURL, ids: [stranded], company: company, logger: TestCluster.logger)
            #expect(kept.map(\.outcome) == [.kept])
            #expect(try await h.scalar(counter) == 1)
            let report = try await CapGateRunner.verifyReport(url: h.databaseURL, logger: TestCluster.logger)
            #expect(report.mismatches.isEmpty && report.unsettled.isEmpty)
            let row = try await Self.events(h, company: company)[stranded]
            #expect(row?["settlement"]?.stringValue == "kept")
            #expect(row?["outcome"]?.stringValue == "charged")
            #expect(row?["upstream_status"]?.intValue == nil)
            #expect(try await Self.csvSettlement(h, company: company)[stranded] == "kept")
            let again = try await CapGateRunner.unsettledKeep(url: h.databaseURL, ids: [stranded], logger: TestCluster.logger)
            #expect(again.first?.outcome == .already("kept"))
            let refund = try await CapGateRunner.unsettledRefund(url: h.databaseURL, ids: [stranded], logger: TestCluster.logger)
            #expect(refund.first?.done == false)
            #expect(try await h.scalar(counter) == 1)
        }
    }

    @Test("settlement states from the ledger columns")
    func states() {
        let now = Date()
        let old = now.addingTimeInterval(-7200)
        typealias State = UnsettledCharges.State
        #expect(State.of(outcome: "charged", settledAt: now, upstreamStatus: 200, createdAt: old, now: now) == .settled)
        #expect(State.of(outcome: "refunded", settledAt: now, upstreamStatus: nil, createdAt: old, now: now) == .settled)
        #expect(State.of(outcome: "charged", settledAt: now, upstreamStatus: nil, createdAt: old, now: now) == .kept)
        #expect(State.of(outcome: "charged", settledAt: nil, upstreamStatus: nil, createdAt: old, now: now) == .unsettled)
        #expect(State.of(outcome: "charged", settledAt: nil, upstreamStatus: nil, createdAt: now, now: now) == .pending)
        #expect(State.of(outcome: "charged", settledAt: nil, upstreamStatus: nil, createdAt: old, now: now, grace: 10_000) == .pending)
    }

    @Test("the binary: verify reports and exits 0 (1 with --strict-unsettled); unsettled list, keep and refund")
    func binary() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (company, users) = try await h.createCompany(
                plan: "low", users: 1, startedAt: Timestamp.format(Date().addingTimeInterval(-86_400)))
            let a = try await Self.strandedCharge(h, company: company, user: users[0].id, hoursAgo: 2)
            let b = try await Self.strandedCharge(h, company: company, user: users[0].id, hoursAgo: 0.5)
            let env = ["DATABASE_URL": h.databaseURL.text]
            let bin = CommandTests.binary
            let (code, out) = try await SDKTests.run(bin, ["verify"], environment: env)
            #expect(code == 0, "\(out)")
            #expect(out.contains("ok: every counter agrees with the ledger"))
            #expect(out.contains("unsettled: company \(company.text): 1 charges, 1 units, oldest \(a) at "), "\(out)")
            let (strict, _) = try await SDKTests.run(bin, ["verify", "--strict-unsettled"], environment: env)
            #expect(strict == 1)
            let (_, wider) = try await SDKTests.run(bin, ["verify", "--unsettled-after", "600"], environment: env)
            #expect(wider.contains("2 charges, 2 units"), "\(wider)")

            let (listed, list) = try await SDKTests.run(bin, ["unsettled", "list", "--company", company.text], environment: env)
            #expect(listed == 0)
            #expect(list.contains("\(a) company \(company.text)") && !list.contains("\(b) company"), "\(list)")
            let (skipped, skip) = try await SDKTests.run(bin, ["unsettled", "refund", String(b)], environment: env)
            #expect(skipped == 1, "\(skip)")
            let (refunded, refund) = try await SDKTests.run(
                bin, ["unsettled", "refund", "--older-than", "600", String(a), String(b)], environment: env)
            #expect(refunded == 0, "\(refund)")
            #expect(refund.contains("refunded \(a)") && refund.contains("refunded \(b)"))
            #expect(try await h.scalar("SELECT sum(used) FROM company_usage WHERE company_id = '\(company.text)'") == 0)
            let c = try await Self.strandedCharge(h, company: company, user: users[0].id, hoursAgo: 2)
            let (keptCode, kept) = try await SDKTests.run(bin, ["unsettled", "keep", String(c)], environment: env)
            #expect(keptCode == 0 && kept.contains("kept \(c)"), "\(kept)")
            let (clean, cleanOut) = try await SDKTests.run(bin, ["verify", "--strict-unsettled"], environment: env)
            #expect(clean == 0, "\(cleanOut)")
            #expect(cleanOut.contains("ok: no charge unsettled"))
            let (bad, _) = try await SDKTests.run(bin, ["unsettled", "list", "--company", "nope"], environment: env)
            #expect(bad == 2)
        }
    }
}
