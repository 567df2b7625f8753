import CapGate
import Foundation
import NIOHTTP1
import Testing

@Suite("Usage for admins and the operator", .timeLimit(.minutes(5)))
struct AdminUsageTests {
    @Test("every admin route: own admin or operator may read; a member and another company's admin get 403 learning nothing")
    func authorizationMatrix() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (a, aUsers) = try await h.createCompany(plan: "low", users: 2, role: "admin")
            let (b, bUsers) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            _ = try await h.message(key: aUsers[1].key)
            let adminA = [("x-api-key", aUsers[0].key)]
            let memberA = [("x-api-key", aUsers[1].key)]
            let adminB = [("x-api-key", bUsers[0].key)]
            let routes = ["", "/usage", "/usage/history", "/usage/models", "/events", "/users", "/api-keys"]
            for route in routes {
                let path = "/admin/v1/companies/\(a.text)\(route)"
                #expect(try await h.request(.GET, path, headers: adminA).status == 200, "\(path)")
                #expect(try await h.request(.GET, path, headers: h.asOperator).status == 200, "\(path)")
                let member = try await h.request(.GET, path, headers: memberA)
                #expect(member.status == 403, "\(path)")
                let other = try await h.request(.GET, path, headers: adminB)
                #expect(other.status == 403, "\(path)")
                #expect(other.json["error"]?["type"]?.stringValue == "permission_error")
                #expect(!other.body.contains(a.text) && !other.body.contains("Test Co"))
                // Asking about a company that does not exist looks the same as asking about B.
                let missing = try await h.request(.GET, "/admin/v1/companies/\(UUID().text)\(route)", headers: adminB)
                #expect(missing.status == 403)
                #expect(missing.body == other.body)
                #expect(try await h.request(.GET, path).status == 401)
            }
            #expect(try await h.request(.GET, "/admin/v1/companies", headers: adminA).status == 403)
            #expect(try await h.request(.GET, "/admin/v1/companies/\(b.text)/usage", headers: adminB).status == 200)
        }
    }

    @Test("company usage shows each user's counters of the current period, whatever the past periods' counters hold")
    func companyUsageOfTheCurrentPeriodAmongPastOnes() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (a, users) = try await h.createCompany(plan: "low", users: 4, role: "admin")
            for _ in 0..<2 { _ = try await h.message(key: users[1].key) }
            _ = try await h.message(key: users[2].key)
            // Three past periods before the current one, every user counted in each (what a
            // company's year of history leaves in user_usage): none of it is the current period's.
            try await h.exec(
                """
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, source)
                SELECT p.company_id, p.plan_id, p.started_at - make_interval(months => k), p.started_at - make_interval(months => k - 1),
                       p.anchor, 'operator'
                  FROM plan_periods p, generate_series(1, 3) k WHERE p.company_id = '\(a.text)';
                INSERT INTO user_usage (company_id, period_id, user_id, used, cost_used)
                SELECT p.company_id, p.id, u.id, 11, 1000
                  FROM plan_periods p JOIN users u ON u.company_id = p.company_id
                 WHERE p.company_id = '\(a.text)' AND p.ends_at <= now();
                """)
            let usage = try await h.op(.GET, "/admin/v1/companies/\(a.text)/usage")
            #expect(usage.status == 200)
            let listed = usage.json["users"]?.arrayValue ?? []
            #expect(listed.count == 4)
            let used = Dictionary(uniqueKeysWithValues: listed.map { ($0["id"]?.stringValue ?? "", $0["used"]?.intValue ?? -1) })
            #expect(used == [users[0].id.text: 0, users[1].id.text: 2, users[2].id.text: 1, users[3].id.text: 0])
            #expect(usage.json["usage"]?["company"]?["used"]?.intValue == 3)
        }
    }

    @Test("company usage lists every user, unused ones at 0; the operator overview sorts by usage, pages on request, else lists all")
    func companyUsage() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 10, user: 5)
            let (a, aUsers) = try await h.createCompany(plan: "low", users: 3, role: "admin")
            let (b, bUsers) = try await h.createCompany(plan: "low", users: 1)
            for _ in 0..<2 { _ = try await h.message(key: aUsers[1].key) }
            for _ in 0..<4 { _ = try await h.message(key: bUsers[0].key) }
            let usage = try await h.request(.GET, "/admin/v1/companies/\(a.text)/usage", headers: [("x-api-key", aUsers[0].key)])
            #expect(usage.json["company"]?["id"]?.stringValue == a.text)
            #expect(usage.json["usage"]?["company"]?["used"]?.intValue == 2)
            #expect(usage.json["usage"]?["company"]?["remaining"]?.intValue == 8)
            let users = usage.json["users"]?.arrayValue ?? []
            #expect(users.count == 3)
            #expect(users.first { $0["id"]?.stringValue == aUsers[1].id.text }?["used"]?.intValue == 2)
            #expect(users.first { $0["id"]?.stringValue == aUsers[2].id.text }?["used"]?.intValue == 0)
            #expect(users.first { $0["id"]?.stringValue == aUsers[2].id.text }?["remaining"]?.intValue == 5)

            let overview = try await h.op(.GET, "/admin/v1/companies?sort=usage")
            let rows = overview.json["data"]?.arrayValue ?? []
            #expect(rows.count == 2)
            #expect(rows.first?["id"]?.stringValue == b.text)
            #expect(rows.first?["percent_used"]?.doubleValue == 40)
            #expect(rows.first?["cap"]?.intValue == 10)
            #expect(rows.first?["period_end"]?.stringValue != nil)
            let page = try await h.op(.GET, "/admin/v1/companies?limit=1")
            #expect(page.json["data"]?.arrayValue?.count == 1)
            #expect(page.json["has_more"]?.boolValue == true)
            let next = try await h.op(.GET, "/admin/v1/companies?limit=1&cursor=\(page.json["next_cursor"]!.stringValue!)")
            #expect(next.json["data"]?.arrayValue?.count == 1)
            #expect(next.json["has_more"]?.boolValue == false)
            #expect(try await h.op(.GET, "/admin/v1/companies?sort=name").status == 400)
            // Without `limit`: every company, however many.
            try await h.exec("INSERT INTO companies (id, name) SELECT gen_random_uuid(), 'Bulk ' || i FROM generate_series(1, 150) i")
            let everyone = try await h.op(.GET, "/admin/v1/companies")
            #expect(everyone.json["data"]?.arrayValue?.count == 152)
            #expect(everyone.json["has_more"]?.boolValue == false)
            #expect(everyone.json["data"]?.arrayValue?.last?["plan"]?.isNull == true)
        }
    }

    @Test("history: one entry per past period, newest first, each counted apart; the current period is not in it")
    func history() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 10, user: 5)
            try await h.createPlan("medium", company: 50, user: 20, sort: 2)
            let (a, users) = try await h.createCompany(plan: "low", users: 1, role: "admin", startedAt: "2026-01-10T00:00:00Z")
            // January's period (4 calls), then a rollover into the current one (1 call), then a plan
            // change ends it (3 calls on medium, in the running period).
            try await h.exec("UPDATE company_usage SET used = 4 WHERE company_id = '\(a.text)'")
            _ = try await BillingTests.rollover(h, at: Timestamp.format(Date()))
            _ = try await h.message(key: users[0].key)
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(a.text)/plan", .obj(["plan": "medium"])).status == 200)
            for _ in 0..<3 { _ = try await h.message(key: users[0].key) }
            let history = try await h.request(
                .GET, "/admin/v1/companies/\(a.text)/usage/history?periods=5", headers: [("x-api-key", users[0].key)])
            #expect(history.status == 200)
            let entries = history.json["data"]?.arrayValue ?? []
            try #require(entries.count == 2, "\(history.body)")
            #expect(entries[0]["plan"]?["id"]?.stringValue == "low")
            #expect(entries[0]["company"]?["used"]?.intValue == 1)
            #expect(entries[0]["company"]?["limit"]?.intValue == 10)
            #expect(entries[1]["period"]?["start"]?.stringValue == "2026-01-10T00:00:00Z")
            #expect(entries[1]["period"]?["end"]?.stringValue == "2026-02-10T00:00:00Z")
            #expect(entries[1]["company"]?["used"]?.intValue == 4)
            let one = try await h.op(.GET, "/admin/v1/companies/\(a.text)/usage/history?periods=1").json["data"]?.arrayValue ?? []
            #expect(one.count == 1 && one.first?["company"]?["used"]?.intValue == 1)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(a.text)/usage/history?periods=0").status == 400)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(a.text)/usage/history?periods=121").status == 400)
        }
    }

    @Test("events: a read right after a call (streamed or not) has its tokens, status, period, company and idempotency key")
    func eventsRightAfterACall() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (a, users) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            let admin = [("x-api-key", users[0].key)]
            for (index, stream) in [false, true, false, true, false, true].enumerated() {
                let key = "retry-safe-\(index)"
                let reply = try await h.message(key: users[0].key, stream: stream, headers: [("idempotency-key", key)])
                #expect(reply.status == 200)
                let requestID = reply.headers.first(name: "request-id")
                // No wait: token counts are written in batches, but before this read answers.
                let rows =
                    try await h.request(.GET, "/admin/v1/companies/\(a.text)/events?limit=1000", headers: admin).json["data"]?
                    .arrayValue ?? []
                let row = rows.first { $0["request_id"]?.stringValue == requestID }
                #expect(row?["output_tokens"]?.intValue == 7, "stream \(stream): \(row?.serialized() ?? "no row")")
                #expect(row?["input_tokens"]?.intValue ?? 0 > 0)
                #expect(row?["upstream_status"]?.intValue == 200)
                #expect(row?["idempotency_key"]?.stringValue == key)
                #expect(row?["company_id"]?.stringValue == a.text)
                #expect(row?["period"]?["start"]?.stringValue != nil && row?["period"]?["end"]?.stringValue != nil)
                let csv = try await h.request(.GET, "/admin/v1/companies/\(a.text)/events", headers: admin + [("accept", "text/csv")])
                let line = csv.body.split(separator: "\n").first { $0.contains(requestID ?? "-") }
                // The cost columns follow `settlement` (empty: admission does not price this call).
                #expect(line?.contains(",\(key),settled,") == true, "\(line ?? "no line")")
            }
        }
    }

    @Test("events: keyset pages, time range, and CSV for the whole range")
    func events() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (a, users) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            for _ in 0..<5 { _ = try await h.message(key: users[0].key) }
            let admin = [("x-api-key", users[0].key)]
            var seen: [Int64] = []
            var cursor: String? = nil
            repeat {
                let path = "/admin/v1/companies/\(a.text)/events?limit=2" + (cursor.map { "&cursor=\($0)" } ?? "")
                let page = try await h.request(.GET, path, headers: admin)
                #expect(page.status == 200)
                seen += (page.json["data"]?.arrayValue ?? []).compactMap { $0["id"]?.intValue }
                cursor = page.json["next_cursor"]?.stringValue
            } while cursor != nil
            #expect(seen.count == 5)
            #expect(Set(seen).count == 5)
            let first = try await h.request(.GET, "/admin/v1/companies/\(a.text)/events", headers: admin).json["data"]!.arrayValue![0]
            #expect(first["outcome"]?.stringValue == "charged")
            #expect(first["route"]?.stringValue == "/v1/messages")
            #expect(first["output_tokens"]?.intValue == 7)
            #expect(first["request_id"]?.stringValue?.hasPrefix("req_") == true)
            let future = try await h.request(.GET, "/admin/v1/companies/\(a.text)/events?from=2999-01-01T00:00:00Z", headers: admin)
            #expect(future.json["data"]?.arrayValue?.isEmpty == true)
            #expect(try await h.request(.GET, "/admin/v1/companies/\(a.text)/events?from=yesterday", headers: admin).status == 400)
            let csv = try await h.request(.GET, "/admin/v1/companies/\(a.text)/events", headers: admin + [("accept", "text/csv")])
            #expect(csv.headers.first(name: "content-type")?.hasPrefix("text/csv") == true)
            let lines = csv.body.split(separator: "\n")
            #expect(lines.count == 6)
            #expect(lines[0].hasPrefix("id,time,user_id,units"))

            // Newest first: the same rows backwards, paged by the smallest id of the page before.
            var backwards: [Int64] = []
            cursor = nil
            repeat {
                let path = "/admin/v1/companies/\(a.text)/events?order=desc&limit=2" + (cursor.map { "&cursor=\($0)" } ?? "")
                let page = try await h.request(.GET, path, headers: admin)
                #expect(page.status == 200)
                backwards += (page.json["data"]?.arrayValue ?? []).compactMap { $0["id"]?.intValue }
                cursor = page.json["next_cursor"]?.stringValue
            } while cursor != nil
            #expect(backwards == seen.reversed())
            let csvDesc = try await h.request(
                .GET, "/admin/v1/companies/\(a.text)/events?order=desc", headers: admin + [("accept", "text/csv")])
            #expect(csvDesc.body == csv.body)
            #expect(try await h.request(.GET, "/admin/v1/companies/\(a.text)/events?order=newest", headers: admin).status == 400)
        }
    }

    @Test(
        "usage reads are one snapshot: while 8 users' calls are admitted, the company's used, its users' sum and the feature counters agree in every read"
    )
    func oneSnapshot() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100_000, user: 100_000)
            let (company, users) = try await h.createCompany(plan: "p", users: 8, role: "admin")
            // Every call is 1 unit of the unlimited feature `analysis`: its company period counter
            // is the company's units, each user's its units (read by the second statement).
            try await FeatureAdmissionTests.seed(h, plan: "p")
            let path = "/admin/v1/companies/\(company.text)/usage"
            let calls = 400
            let done = BurstDone()
            /// Figures that one read must show equal, named for the failure message.
            typealias Read = [(String, Int64?)]
            func analysis(_ features: JSON?) -> JSON? { features?.arrayValue?.first { $0["id"]?.stringValue == "analysis" } }
            func adminRead() async throws -> Read {
                let json = try await h.op(.GET, path).json
                let rows = json["users"]?.arrayValue ?? []
                return [
                    ("usage.company.used", json["usage"]?["company"]?["used"]?.intValue),
                    ("sum of users[].used", rows.count == 8 ? rows.reduce(0) { $0 + ($1["used"]?.intValue ?? 0) } : nil),
                    ("features[analysis].period.used", analysis(json["features"])?["period"]?["used"]?.intValue),
                    (
                        "sum of users[].features[analysis].user_period.used",
                        rows.reduce(0) { $0 + (analysis($1["features"])?["user_period"]?["used"]?.intValue ?? 0) }
                    ),
                ]
            }
            func callerRead(_ key: String) async throws -> [Read] {
                let json = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", key)]).json
                let feature = analysis(json["features"])
                return [
                    [
                        ("company.used", json["company"]?["used"]?.intValue),
                        ("features[analysis].period.used", feature?["period"]?["used"]?.intValue),
                    ],
                    [
                        ("user.used", json["user"]?["used"]?.intValue),
                        ("features[analysis].user_period.used", feature?["user_period"]?["used"]?.intValue),
                    ],
                ]
            }
            let reads = try await withThrowingTaskGroup(of: [Read].self) { group in
                group.addTask {
                    let counts = try await ConcurrencyTests.burst(h, keys: users.map(\.key), count: calls, gateways: [h.gatewayURL])
                    await done.set(counts[200] ?? 0)
                    return []
                }
                for reader in 0..<3 {
                    group.addTask {
                        var seen: [Read] = []
                        while await done.admitted == nil {
                            if reader == 0 { seen += try await callerRead(users[1].key) } else { seen.append(try await adminRead()) }
                        }
                        return seen
                    }
                }
                var all: [Read] = []
                for try await part in group { all += part }
                return all
            }
            let admitted = await done.admitted ?? 0
            #expect(admitted == calls)
            #expect(reads.count > 5, "too few reads overlapped the calls: \(reads.count)")
            #expect(reads.contains { ($0[0].1 ?? 0) > 0 && ($0[0].1 ?? 0) < Int64(admitted) }, "no read saw calls in progress")
            for read in reads {
                #expect(read.allSatisfy { $0.1 != nil && $0.1 == read[0].1 }, "\(read)")
            }
            let last = try await adminRead()
            #expect(last.allSatisfy { $0.1 == Int64(admitted) }, "\(last)")
        }
    }

    @Test(
        "the snapshot read's upgrade offer is the admission's: /v1/usage, the admin read and usage/check (MeteringStore.upgrade) agree on every plan"
    )
    func upgradeAgrees() async throws {
        try await Harness.with { h in
            try await h.createPlan("free", company: 10, user: 5, sort: 0)
            try await h.createPlan("low", company: 100, user: 5, sort: 1)
            try await h.createPlan("mid", company: 100, user: 50, sort: 2)
            try await h.createPlan("off", company: nil, user: nil, sort: 3)
            #expect(try await h.op(.PUT, "/admin/v1/plans/off", .obj(["is_active": false])).status == 200)
            try await h.createPlan("top", company: nil, user: nil, sort: 4)
            try await h.createPlan("late", company: 20, user: 20, sort: 5)
            func fields(_ offer: JSON?) -> [String] {
                guard let offer, !offer.isNull else { return ["null"] }
                return ["plan", "company_limit", "user_limit"].map { offer[$0].map { $0.serialized() } ?? "absent" }
            }
            for plan in ["free", "low", "mid", "top", "late", nil] as [String?] {
                let (company, users) = try await h.createCompany(plan: plan, users: 1, role: "admin")
                let key = [("x-api-key", users[0].key)]
                let read = try await h.request(.GET, "/v1/usage", headers: key).json["upgrade"]
                let admin = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: key).json["usage"]?["upgrade"]
                let check = try await h.request(.GET, "/v1/usage/check?units=1", headers: key).json["usage"]?["upgrade"]
                #expect(fields(read) == fields(check), "\(plan ?? "no plan")")
                #expect(fields(admin) == fields(check), "\(plan ?? "no plan")")
                #expect(read != nil && check != nil)
            }
        }
    }
}

/// Set once when a burst of calls has ended, with how many were admitted.
private actor BurstDone {
    var admitted: Int? = nil
    func set(_ count: Int) { admitted = count }
}
