import CapGate
import Foundation
import NIOHTTP1
import Testing

/// SPEC §8 in the reads: `features` in `GET /v1/usage` and the admin usage read (per user too),
/// `GET /v1/usage/check?feature=`, history and events filtered by `feature`. Every number is
/// compared with the counters and the ledger in the database after real calls through the gateway.
@Suite("Features in the usage reads", .timeLimit(.minutes(5)))
struct FeatureReadTests {
    /// A zone whose midnight is not at a whole UTC hour (UTC+05:30, no DST).
    static let zone = "Asia/Kolkata"

    /// Plan `p` (caps 100/50) with `analysis` (the seed's limits below, on `/v1/messages`), `chat`
    /// (unlimited, by header), `aardvark` (sort order 3: listed last), `voice` disabled in the
    /// plan and `compat` in no plan; a company in `zone` with an admin and two members.
    static func setUp(_ h: Harness) async throws -> (company: UUID, users: [(id: UUID, key: String)]) {
        try await h.createPlan("p", company: 100, user: 50, sort: 1)
        let (company, users) = try await h.createCompany(plan: "p", users: 3, role: "admin")
        try await FeatureAdmissionTests.seed(h, plan: "p", daily: 10, period: 40, userDaily: 4, userPeriod: 30)
        try await h.exec(
            """
            INSERT INTO features (id, name, sort_order) VALUES ('aardvark', 'Aardvark', 3), ('voice', 'Voice', 4), ('compat', 'Compat', 5);
            INSERT INTO plan_features (plan_id, feature_id, daily_limit) VALUES ('p', 'chat', NULL), ('p', 'aardvark', 2);
            INSERT INTO plan_features (plan_id, feature_id, enabled, daily_limit) VALUES ('p', 'voice', false, 9);
            UPDATE companies SET time_zone = '\(zone)' WHERE id = '\(company.text)'
            """)
        return (company, users)
    }

    /// A counter as the admission keyed it: the day window starts at midnight in the company's
    /// zone (`capgate_day_start`), the period window at the current period's start. 0 when absent.
    static func counter(_ h: Harness, company: UUID, user: UUID? = nil, feature: String, span: String) async throws -> Int64 {
        let start =
            span == "day"
            ? "capgate_day_start(now(), (SELECT time_zone FROM companies WHERE id = '\(company.text)'))"
            : "(SELECT started_at FROM plan_periods WHERE company_id = '\(company.text)' AND started_at <= now() AND ends_at > now())"
        let table = user == nil ? "company_feature_usage" : "user_feature_usage"
        let who = user.map { " AND user_id = '\($0.text)'" } ?? ""
        return try await h.scalar(
            """
            SELECT coalesce((SELECT used FROM \(table) WHERE company_id = '\(company.text)'\(who) AND feature_id = '\(feature)'
                                AND span = '\(span)' AND starts_at = \(start)), 0)
            """)
    }

    /// The next midnight in `zone` after `now`, by Foundation's calendar (not PostgreSQL's).
    static func nextMidnight(in zone: String, after now: Date) throws -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = try #require(TimeZone(identifier: zone))
        return try #require(calendar.date(byAdding: .day, value: 1, to: calendar.startOfDay(for: now)))
    }

    /// Every problem `value` has against `components/schemas/<schema>` of openapi.yaml (JSON
    /// Schema 2020-12, as OpenAPI 3.1 uses, formats such as date-time checked), empty when it
    /// conforms. The validator is schemathesis's own (jsonschema_rs).
    static func schemaProblems(_ value: JSON, _ schema: String) async throws -> String {
        let script = """
            import json, sys, yaml, jsonschema_rs
            doc = yaml.safe_load(open(sys.argv[1]))
            doc["$ref"] = "#/components/schemas/" + sys.argv[2]
            errors = jsonschema_rs.Draft202012Validator(doc, validate_formats=True).iter_errors(json.loads(sys.argv[3]))
            print("\\n".join(f"{list(e.instance_path)}: {e.message}" for e in errors))
            """
        let python = try await PythonTools.python()
        let (status, output) = try await SDKTests.run(
            python, ["-c", script, SDKTests.root.appendingPathComponent("openapi.yaml").path, schema, value.serialized()])
        try #require(status == 0, "\(output)")
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The calls answered 200, by feature, for each user (in the order of `users`).
    struct Calls {
        var analysis: [Int64]
        var chat: [Int64]
    }

    /// Calls through the gateway: the admin 3 analyses, the first member 2 analyses and 2 chats,
    /// the second member nothing.
    static func makeCalls(_ h: Harness, users: [(id: UUID, key: String)]) async throws -> Calls {
        var calls = Calls(analysis: users.map { _ in 0 }, chat: users.map { _ in 0 })
        for (user, analyses, chats) in [(0, 3, 0), (1, 2, 2)] {
            for _ in 0..<analyses {
                if try await h.message(key: users[user].key).status == 200 { calls.analysis[user] += 1 }
            }
            for _ in 0..<chats {
                if try await h.message(key: users[user].key, headers: [("CapGate-Feature", "chat")]).status == 200 { calls.chat[user] += 1 }
            }
        }
        return calls
    }

    @Test(
        "GET /v1/usage: every feature of the plan in sort order with the caller's and the company's windows as counted, day reset_at the next midnight in the company's zone"
    )
    func clientUsage() async throws {
        try await Harness.with { h in
            let (company, users) = try await Self.setUp(h)
            let calls = try await Self.makeCalls(h, users: users)
            let before = Date()
            let reply = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[1].key)])
            #expect(reply.status == 200)
            let features = try #require(reply.json["features"]?.arrayValue)
            #expect(features.map { $0["id"]?.stringValue ?? "" } == ["analysis", "chat", "aardvark", "voice"])
            let periodEnd = try #require(reply.json["period"]?["end"]?.stringValue)
            let midnight = Timestamp.format(try Self.nextMidnight(in: Self.zone, after: before))
            for feature in features {
                let id = try #require(feature["id"]?.stringValue)
                for (key, user, span) in [
                    ("day", nil, "day"), ("period", nil, "period"), ("user_day", users[1].id, "day"),
                    ("user_period", users[1].id, "period"),
                ] {
                    let window = try #require(feature[key], "\(id).\(key)")
                    let counted = try await Self.counter(h, company: company, user: user, feature: id, span: span)
                    #expect(window["used"]?.intValue == counted, "\(id).\(key)")
                    #expect(window["reset_at"]?.stringValue == (span == "day" ? midnight : periodEnd), "\(id).\(key)")
                }
            }
            // The calls answered 200 are what was counted (the comparisons above are not all zeros),
            // and limit and remaining follow the entitlement.
            let analysis = features[0]
            let analyses = calls.analysis.reduce(0, +)
            #expect(analyses > 0 && calls.analysis[1] > 0)
            #expect(analysis["name"]?.stringValue == "Analysis")
            #expect(analysis["enabled"]?.boolValue == true)
            #expect(analysis["day"]?["used"]?.intValue == analyses)
            #expect(analysis["period"]?["used"]?.intValue == analyses)
            #expect(analysis["user_day"]?["used"]?.intValue == calls.analysis[1])
            #expect(analysis["day"]?["limit"]?.intValue == 10)
            #expect(analysis["day"]?["remaining"]?.intValue == 10 - analyses)
            #expect(analysis["user_period"]?["remaining"]?.intValue == 30 - calls.analysis[1])
            let chat = features[1]
            #expect(calls.chat[1] > 0)
            #expect(chat["user_period"]?["used"]?.intValue == calls.chat[1])
            #expect(chat["day"]?["limit"]?.isNull == true)
            #expect(chat["day"]?["remaining"]?.isNull == true)
            // Disabled in the plan: listed, nothing can be used.
            #expect(features[3]["enabled"]?.boolValue == false)
            #expect(features[3]["day"]?["limit"]?.intValue == 0)
            #expect(features[3]["day"]?["remaining"]?.intValue == 0)
            // The caps are unchanged by features: the company counter is the ledger's sum.
            #expect(
                reply.json["company"]?["used"]?.intValue
                    == (try await h.scalar(
                        "SELECT sum(units) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'")))
            #expect(try await Self.schemaProblems(reply.json, "Usage") == "")

            // A member of a plan with no features gets an empty list.
            try await h.createPlan("bare", company: 10, user: 10, sort: 0)
            let (_, bare) = try await h.createCompany(plan: "bare", users: 1)
            let empty = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", bare[0].key)])
            #expect(empty.json["features"]?.arrayValue?.isEmpty == true)
        }
    }

    @Test("the admin read: the company's windows at the top and in usage, each user's own windows in users[], unused users at 0")
    func adminUsage() async throws {
        try await Harness.with { h in
            let (company, users) = try await Self.setUp(h)
            _ = try await Self.makeCalls(h, users: users)
            let reply = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: [("x-api-key", users[0].key)])
            #expect(reply.status == 200)
            let features = try #require(reply.json["features"]?.arrayValue)
            #expect(reply.json["usage"]?["features"]?.arrayValue == features)
            #expect(features.count == 4)
            for feature in features {
                let id = try #require(feature["id"]?.stringValue)
                #expect(feature["day"]?["used"]?.intValue == (try await Self.counter(h, company: company, feature: id, span: "day")))
                #expect(feature["period"]?["used"]?.intValue == (try await Self.counter(h, company: company, feature: id, span: "period")))
                #expect(feature["user_day"]?.isNull == true)
                #expect(feature["user_period"]?.isNull == true)
            }
            let rows = try #require(reply.json["users"]?.arrayValue)
            #expect(rows.count == 3)
            var seen: Int64 = 0
            for row in rows {
                let user = try #require(row["id"]?.stringValue.flatMap(UUID.init(uuidString:)))
                let mine = try #require(row["features"]?.arrayValue)
                #expect(mine.map { $0["id"]?.stringValue ?? "" } == features.map { $0["id"]?.stringValue ?? "" })
                for feature in mine {
                    let id = try #require(feature["id"]?.stringValue)
                    let day = try await Self.counter(h, company: company, user: user, feature: id, span: "day")
                    let period = try await Self.counter(h, company: company, user: user, feature: id, span: "period")
                    #expect(feature["user_day"]?["used"]?.intValue == day, "\(user) \(id)")
                    #expect(feature["user_period"]?["used"]?.intValue == period, "\(user) \(id)")
                    #expect(feature["day"] == nil)
                    seen += period
                }
            }
            // Every charged feature unit of the ledger is in some user's windows.
            #expect(
                seen
                    == (try await h.scalar(
                        "SELECT sum(units) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged' AND feature IS NOT NULL"
                    )))
            let idle = try #require(rows.first { $0["id"]?.stringValue == users[2].id.text })
            #expect(idle["features"]?.arrayValue?.first?["user_day"]?["used"]?.intValue == 0)
            #expect(idle["features"]?.arrayValue?.first?["user_day"]?["remaining"]?.intValue == 4)
            #expect(try await Self.schemaProblems(reply.json, "CompanyUsage") == "")
            #expect(try await h.op(.GET, "/admin/v1/companies/\(company.text)/usage").json["features"] == reply.json["features"])
        }
    }

    @Test(
        "usage/check with feature: allowed, a limit that would be exceeded, not in plan or disabled, unknown or malformed is 400; records nothing"
    )
    func check() async throws {
        try await Harness.with { h in
            let (company, users) = try await Self.setUp(h)
            try await h.createPlan("bigger", company: 100, user: 50, sort: 2)
            try await h.exec(
                "INSERT INTO plan_features (plan_id, feature_id, daily_limit, user_daily_limit) VALUES ('bigger', 'analysis', 60, 40), ('bigger', 'compat', 1, NULL)"
            )
            let calls = try await Self.makeCalls(h, users: users)
            let key = [("x-api-key", users[1].key)]
            func check(_ query: String) async throws -> Harness.Reply {
                try await h.request(.GET, "/v1/usage/check?\(query)", headers: key)
            }
            let ledger = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'"
            let counters = "SELECT coalesce(sum(used), 0) FROM user_feature_usage WHERE company_id = '\(company.text)'"
            let (rowsBefore, usedBefore) = (try await h.scalar(ledger), try await h.scalar(counters))

            let dayUsed = try await Self.counter(h, company: company, feature: "analysis", span: "day")
            let userDayUsed = try await Self.counter(h, company: company, user: users[1].id, feature: "analysis", span: "day")
            // Room for what is left of the user's day (4 a day) and the company's (10).
            let fits = try await check("feature=analysis&units=\(min(4 - userDayUsed, 10 - dayUsed))")
            #expect(fits.status == 200)
            #expect(fits.json["allowed"]?.boolValue == true)
            #expect(fits.json["reason"]?.isNull == true)
            #expect(fits.headers.first(name: "ratelimit-policy")?.contains("\"feature.analysis.day\";q=10;") == true)
            #expect(try await Self.schemaProblems(fits.json, "UsageCheck") == "")

            // One more than the company's day has left: refused by the company day window.
            let over = try await check("feature=analysis&units=\(10 - dayUsed + 1)")
            #expect(over.json["allowed"]?.boolValue == false)
            #expect(over.json["reason"]?.stringValue == "feature_limit_exceeded")
            let feature = over.json["usage"]?["feature"]
            #expect(feature?["window"]?.stringValue == "day")
            #expect(feature?["scope"]?.stringValue == "company")
            #expect(feature?["used"]?.intValue == dayUsed)
            #expect(feature?["remaining"]?.intValue == 10 - dayUsed)
            #expect(feature?["reset_at"]?.stringValue == Timestamp.format(try Self.nextMidnight(in: Self.zone, after: Date())))
            #expect(over.json["usage"]?["scope"]?.stringValue == "company")
            #expect(over.json["usage"]?["upgrade"]?["plan"]?.stringValue == "bigger")
            #expect(over.json["usage"]?["upgrade"]?["feature_limit"]?.intValue == 60)
            #expect(try await Self.schemaProblems(over.json, "UsageCheck") == "")
            // The user's own day: within the company's day, over the user's.
            let mine = try await check("feature=analysis&units=\(4 - userDayUsed + 1)")
            #expect(mine.json["reason"]?.stringValue == "feature_limit_exceeded")
            #expect(mine.json["usage"]?["feature"]?["scope"]?.stringValue == "user")
            #expect(mine.json["usage"]?["feature"]?["used"]?.intValue == userDayUsed)
            #expect(mine.json["usage"]?["upgrade"]?["feature_limit"]?.intValue == 40)
            // The caps still come first.
            #expect(try await check("feature=analysis&units=51").json["reason"]?.stringValue == "usage_cap_exceeded")

            // Not in the plan, or disabled there.
            for id in ["compat", "voice"] {
                let refused = try await check("feature=\(id)")
                #expect(refused.status == 200)
                #expect(refused.json["allowed"]?.boolValue == false, "\(id)")
                #expect(refused.json["reason"]?.stringValue == "feature_not_in_plan", "\(id)")
                #expect(refused.json["usage"]?["feature"]?["id"]?.stringValue == id)
                #expect(try await Self.schemaProblems(refused.json, "UsageCheck") == "")
            }
            #expect(try await check("feature=compat").json["usage"]?["upgrade"]?["plan"]?.stringValue == "bigger")

            // Unknown, inactive or malformed: 400 in the error envelope.
            try await h.exec("UPDATE features SET is_active = false WHERE id = 'aardvark'")
            for query in [
                "feature=nope", "feature=aardvark", "feature=Bad%20Name!", "feature=", "feature=\(String(repeating: "a", count: 65))",
            ] {
                let bad = try await check(query)
                #expect(bad.status == 400, "\(query)")
                #expect(bad.json["error"]?["type"]?.stringValue == "invalid_request_error", "\(query)")
            }
            #expect(try await h.scalar(ledger) == rowsBefore)
            #expect(try await h.scalar(counters) == usedBefore)
            #expect(h.mock.counter.count == Int(calls.analysis.reduce(0, +) + calls.chat.reduce(0, +)))
        }
    }

    @Test(
        "history and events filtered by feature: a past period's used is that feature's charged units; events and CSV only its rows; bad ids 400"
    )
    func historyAndEvents() async throws {
        try await Harness.with { h in
            let (company, users) = try await Self.setUp(h)
            _ = try await Self.makeCalls(h, users: users)
            // A refused call (529 from the provider) is refunded: in the ledger, counted nowhere.
            #expect(try await h.message(key: users[2].key, headers: [("x-mock-status", "529")]).status == 529)
            let c = company.text
            let periodStart = try #require(
                try await h.text("SELECT started_at FROM plan_periods WHERE company_id = '\(c)' AND ends_at > now()"))
            // A new period starts now: the one with the calls becomes history.
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(c)/plan", .obj(["plan": "p"])).status == 200)
            let admin = [("x-api-key", users[0].key)]
            func history(_ query: String) async throws -> Harness.Reply {
                try await h.request(.GET, "/admin/v1/companies/\(c)/usage/history?\(query)", headers: admin)
            }
            for feature in ["analysis", "chat"] {
                let reply = try await history("periods=1&feature=\(feature)")
                #expect(reply.status == 200)
                let entry = try #require(reply.json["data"]?.arrayValue?.first)
                let counted = try await h.scalar(
                    """
                    SELECT used FROM company_feature_usage WHERE company_id = '\(c)' AND feature_id = '\(feature)' AND span = 'period'
                       AND starts_at = '\(periodStart)'
                    """)
                let charged = try await h.scalar(
                    """
                    SELECT sum(l.units) FROM usage_ledger l JOIN plan_periods pp ON pp.id = l.period_id
                     WHERE l.company_id = '\(c)' AND l.feature = '\(feature)' AND l.outcome = 'charged' AND pp.started_at = '\(periodStart)'
                    """)
                #expect(counted > 0)
                #expect(entry["used"]?.intValue == counted, "\(feature)")
                #expect(entry["used"]?.intValue == charged, "\(feature)")
                #expect(entry["company"]?["used"]?.intValue == counted)
                #expect(entry["feature"]?.stringValue == feature)
                #expect(try await Self.schemaProblems(reply.json, "HistoryList") == "")
            }
            #expect(try await history("periods=1&feature=analysis").json["data"]?.arrayValue?.first?["limit"]?.intValue == 40)
            #expect(try await history("periods=1&feature=chat").json["data"]?.arrayValue?.first?["limit"]?.isNull == true)
            let all = try #require(try await history("periods=1").json["data"]?.arrayValue?.first)
            #expect(
                all["used"]?.intValue
                    == (try await h.scalar("SELECT sum(units) FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged'")))
            #expect(all["feature"]?.isNull == true)
            let unknown = try #require(try await history("periods=1&feature=nope").json["data"]?.arrayValue?.first)
            #expect(unknown["used"]?.intValue == 0)
            #expect(unknown["limit"]?.intValue == 0)
            #expect(try await history("feature=NOPE").status == 400)
            #expect(try await history("feature=").json["error"]?["type"]?.stringValue == "invalid_request_error")

            func events(_ query: String, csv: Bool = false) async throws -> Harness.Reply {
                try await h.request(
                    .GET, "/admin/v1/companies/\(c)/events?\(query)", headers: admin + (csv ? [("accept", "text/csv")] : []))
            }
            for feature in ["analysis", "chat"] {
                let rows = try #require(try await events("feature=\(feature)&limit=1000").json["data"]?.arrayValue)
                let inLedger = try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND feature = '\(feature)'")
                #expect(inLedger > 0)
                #expect(rows.count == Int(inLedger), "\(feature)")
                #expect(rows.allSatisfy { $0["feature"]?.stringValue == feature })
                let csv = try await events("feature=\(feature)", csv: true)
                #expect(csv.status == 200)
                let lines = csv.body.split(separator: "\n").dropFirst()
                #expect(lines.count == Int(inLedger))
                #expect(lines.allSatisfy { $0.split(separator: ",", omittingEmptySubsequences: false)[15] == feature })
            }
            // Paging with the filter: the cursor continues within the feature's rows.
            let first = try await events("feature=analysis&limit=2")
            #expect(first.json["has_more"]?.boolValue == true)
            let next = try await events("feature=analysis&limit=1000&cursor=\(first.json["next_cursor"]?.stringValue ?? "")")
            #expect(
                (first.json["data"]?.arrayValue?.count ?? 0) + (next.json["data"]?.arrayValue?.count ?? 0)
                    == Int(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND feature = 'analysis'")))
            #expect(try await events("feature=nope").json["data"]?.arrayValue?.isEmpty == true)
            #expect(try await events("feature=nope", csv: true).body.split(separator: "\n").count == 1)
            for bad in ["feature=Bad", "feature=", "feature=a%2Cb"] {
                #expect(try await events(bad).status == 400, "\(bad)")
                #expect(try await events(bad, csv: true).status == 400, "\(bad)")
            }
        }
    }

    @Test("another company's admin gets 403 on every feature read and learns nothing; a member gets 403 on the admin reads")
    func otherTenants() async throws {
        try await Harness.with { h in
            let (company, users) = try await Self.setUp(h)
            let (_, other) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            _ = try await Self.makeCalls(h, users: users)
            let paths = [
                "/usage", "/usage/history?feature=analysis", "/usage/history?feature=BAD", "/events?feature=analysis",
                "/events?feature=BAD",
            ]
            for path in paths {
                let url = "/admin/v1/companies/\(company.text)\(path)"
                for accept in ["application/json", "text/csv"] {
                    let reply = try await h.request(.GET, url, headers: [("x-api-key", other[0].key), ("accept", accept)])
                    #expect(reply.status == 403, "\(path)")
                    #expect(reply.json["error"]?["type"]?.stringValue == "permission_error")
                    #expect(!reply.body.contains(company.text) && !reply.body.contains("analysis") && !reply.body.contains("Analysis"))
                    let member = try await h.request(.GET, url, headers: [("x-api-key", users[1].key), ("accept", accept)])
                    #expect(member.status == 403, "\(path)")
                }
                #expect(try await h.request(.GET, url, headers: [("x-api-key", users[0].key)]).status == (path.contains("BAD") ? 400 : 200))
            }
            // Their own reads show their own company: nothing of the other's features is used there.
            let theirs = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", other[0].key)])
            #expect(theirs.json["features"]?.arrayValue?.allSatisfy { $0["day"]?["used"]?.intValue == 0 } == true)
        }
    }
}
