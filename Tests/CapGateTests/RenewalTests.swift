import CapGate
import Foundation
import Testing

/// SPEC §6: calls never wait for the rollover job. A call after the period ended opens the next
/// period in its own admission, exactly as `capgate rollover` would, once under concurrency.
@Suite("Renewal inside the admission", .serialized, .timeLimit(.minutes(10)))
struct RenewalTests {
    static func iso(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    @Test("a period ending mid-test with 8 callers going on: no 402, one new period, counters exact")
    func periodEndsUnderLoad() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100_000, user: 100_000)
            let (company, users) = try await h.createCompany(plan: nil, users: 4)
            // A monthly period that ends about 8 s from now, started once the company exists (the
            // margin lets calls land in the old period while the whole suite loads both cores).
            let boundary = Date().addingTimeInterval(8)
            var utc = Calendar(identifier: .gregorian)
            utc.timeZone = TimeZone(identifier: "UTC")!
            let start = utc.date(byAdding: .month, value: -1, to: boundary)!
            let put = try await h.op(
                .PUT, "/admin/v1/companies/\(company.text)/plan", .obj(["plan": "low", "started_at": .string(Self.iso(start))]))
            #expect(put.status == 200, "\(put.body)")
            let endsIn = try await h.scalar(
                "SELECT extract(epoch FROM max(ends_at) - now())::bigint FROM plan_periods WHERE company_id = '\(company.text)'")
            #expect((0...8).contains(endsIn), "the period ends in \(endsIn) s")
            // One call in the old period at once, and one in the new after the boundary: the callers
            // below may all land on one side of it under the whole suite's load (a fresh-clone run
            // saw the charged calls in one period only).
            let early = try await h.message(key: users[0].key).status

            // Callers from now until 2 s after the boundary.
            let until = ContinuousClock.now + .seconds(boundary.timeIntervalSinceNow + 2)
            let concurrent = try await withThrowingTaskGroup(of: [Int].self) { group in
                for i in 0..<8 {
                    group.addTask {
                        var seen: [Int] = []
                        while ContinuousClock.now < until && seen.count < 2_000 {
                            seen.append(try await h.message(key: users[i % users.count].key).status)
                        }
                        return seen
                    }
                }
                return try await group.reduce(into: [Int]()) { $0 += $1 }
            }
            if boundary.timeIntervalSinceNow > 0 { try await Task.sleep(for: .seconds(boundary.timeIntervalSinceNow + 0.5)) }
            let late = try await h.message(key: users[1].key).status
            let statuses = [early] + concurrent + [late]
            #expect(!statuses.isEmpty)
            #expect(statuses.allSatisfy { $0 == 200 }, "statuses other than 200: \(Set(statuses))")
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2)
            // Both periods counted calls; the new one starts where the old one ended, on the same plan.
            #expect(
                try await h.scalar(
                    """
                    SELECT count(DISTINCT period_id) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'
                    """) == 2)
            #expect(
                try await h.scalar(
                    """
                    SELECT count(*) FROM plan_periods a JOIN plan_periods b ON b.company_id = a.company_id AND b.started_at = a.ends_at
                     WHERE a.company_id = '\(company.text)' AND b.plan_id = 'low'
                    """) == 1)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == Int64(statuses.count))
            #expect(Int64(h.mock.served.count) == Int64(statuses.count))
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("batched and single admissions after the end: auto-renew keeps the plan, a cancelled plan falls to the default, months caught up")
    func sqlRenewal() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 10, user: 10, isDefault: true)
            try await h.createPlan("low", company: 100, user: 25)
            let (renewing, a) = try await h.createCompany(plan: "low", users: 1, startedAt: "2026-01-31T10:00:00Z")
            let (cancelled, b) = try await h.createCompany(plan: "low", users: 1, startedAt: "2026-01-31T10:00:00Z")
            try await h.exec("UPDATE plan_periods SET auto_renew = false WHERE company_id = '\(cancelled.text)'")
            // Three months later, in one batch of four calls: each company is renewed once.
            let at = "'2026-04-30T12:00:00Z'::timestamptz"
            let decisions = try await h.text(
                """
                SELECT string_agg(decision, ',' ORDER BY item) FROM capgate_admit_batch(
                    ARRAY[''::bytea, '', '', ''], ARRAY['\(renewing.text)', '\(renewing.text)', '\(cancelled.text)', '\(cancelled.text)']::uuid[],
                    ARRAY['\(a[0].id.text)', '\(a[0].id.text)', '\(b[0].id.text)', '\(b[0].id.text)']::uuid[], ARRAY[1, 1, 1, 1],
                    ARRAY['POST', 'POST', 'POST', 'POST'], ARRAY['/v1/m', '/v1/m', '/v1/m', '/v1/m'], ARRAY['', '', '', ''],
                    ARRAY['', '', '', ''], ARRAY['r1', 'r2', 'r3', 'r4'], ARRAY[-1, -1, -1, -1]::bigint[],
                    ARRAY[\(at), \(at), \(at), \(at)], false, array_fill(-2::bigint, ARRAY[4]), array_fill(-1::bigint, ARRAY[4]),
                    array_fill(0::smallint, ARRAY[4]), array_fill(0::bigint, ARRAY[4]))
                """)
            #expect(decisions == "charged,charged,charged,charged")
            // Anchored on Jan 31 10:00 and clamped to the month's last day: Apr 30 12:00 is in
            // [Apr 30 10:00, May 31 10:00).
            #expect(
                try await h.text(
                    """
                    SELECT plan_id || ' ' || to_char(started_at AT TIME ZONE 'UTC', 'MM-DD HH24') || ' ' || to_char(ends_at AT TIME ZONE 'UTC', 'MM-DD HH24')
                      FROM plan_periods WHERE company_id = '\(renewing.text)' ORDER BY started_at DESC LIMIT 1
                    """) == "low 04-30 10 05-31 10")
            #expect(
                try await h.text(
                    "SELECT plan_id FROM plan_periods WHERE company_id = '\(cancelled.text)' ORDER BY started_at DESC LIMIT 1") == "free")
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods") == 4)
            // The single-call path the same way, a month on.
            let single = try await h.text(
                """
                SELECT (capgate_charge('\(renewing.text)', '\(a[0].id.text)', 1, 'POST', '/v1/m', NULL, NULL, 'r5', NULL,
                        '2026-06-01T00:00:00Z')).decision
                """)
            #expect(single == "charged")
            #expect(
                try await h.text(
                    """
                    SELECT to_char(started_at AT TIME ZONE 'UTC', 'MM-DD HH24') FROM plan_periods
                     WHERE company_id = '\(renewing.text)' ORDER BY started_at DESC LIMIT 1
                    """) == "05-31 10")
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("a usage read after the period ended shows the renewed period, as the next call would see it")
    func usageReadRenews() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: nil, users: 1)
            // A period that ended a second ago, and no call since.
            try await h.exec(
                """
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                VALUES ('\(company.text)', 'low', now() - interval '1 month' - interval '1 second',
                        now() - interval '1 second', now() - interval '1 month' - interval '1 second')
                """)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.status == 200)
            #expect(usage.json["plan"]?["id"]?.stringValue == "low")
            #expect(usage.json["company"]?["used"]?.intValue == 0)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2)
        }
    }

    @Test("the company object after a plan assigned from a past start shows that plan and its renewal, and moves nothing")
    func companyReadAfterPastStart() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, _) = try await h.createCompany(plan: nil, users: 1)
            var utc = Calendar(identifier: .gregorian)
            utc.timeZone = TimeZone(identifier: "UTC")!
            let start = utc.date(byAdding: .month, value: -10, to: Date())!
            let path = "/admin/v1/companies/\(company.text)"
            let put = try await h.op(.PUT, path + "/plan", .obj(["plan": "low", "started_at": .string(Self.iso(start))]))
            #expect(put.status == 200, "\(put.body)")
            for reply in [put, try await h.op(.GET, path)] {
                #expect(reply.json["plan"]?.stringValue == "low", "\(reply.body)")
                #expect(reply.json["auto_renew"]?.boolValue == true, "\(reply.body)")
                #expect(reply.json["period"]?["start"] != nil && reply.json["period"] != .null, "\(reply.body)")
            }
            // A read changes nothing: the rollover (or the next call) moves the company on.
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 1)
            // A period that will not renew (expired, refunded, cancelled) is no plan.
            for change in ["status = 'expired'", "status = 'cancelled'", "auto_renew = false"] {
                try await h.exec("UPDATE plan_periods SET status = 'active', auto_renew = true WHERE company_id = '\(company.text)'")
                try await h.exec("UPDATE plan_periods SET \(change) WHERE company_id = '\(company.text)'")
                let read = try await h.op(.GET, path)
                #expect(read.json["plan"] == .null && read.json["auto_renew"]?.boolValue == false, "\(change): \(read.body)")
            }
        }
    }
}
