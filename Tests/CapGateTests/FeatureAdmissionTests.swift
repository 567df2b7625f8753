import CapGate
import Foundation
import Testing

/// SPEC §8 in the admission: features with day and period limits, weighted and free routes,
/// exact under concurrency, days in the company's time zone.
@Suite("Features, routes and daily limits in the admission", .timeLimit(.minutes(5)))
struct FeatureAdmissionTests {
    /// A feature `analysis` on `plan` with the given limits, and the recommended route table.
    static func seed(
        _ h: Harness, plan: String, daily: Int64? = nil, period: Int64? = nil, userDaily: Int64? = nil, userPeriod: Int64? = nil,
        message: String? = nil
    ) async throws {
        func sql(_ value: Int64?) -> String { value.map(String.init) ?? "NULL" }
        try await h.exec(
            """
            INSERT INTO features (id, name, sort_order) VALUES ('analysis', 'Analysis', 1), ('chat', 'Chat', 2);
            INSERT INTO plan_features (plan_id, feature_id, daily_limit, period_limit, user_daily_limit, user_period_limit, message)
            VALUES ('\(plan)', 'analysis', \(sql(daily)), \(sql(period)), \(sql(userDaily)), \(sql(userPeriod)),
                    \(message.map { "'\($0)'" } ?? "NULL"));
            INSERT INTO routes (id, method, path, units, feature, feature_header, items_field) VALUES
                ('models', 'GET', '/v1/models*', 0, NULL, false, NULL),
                ('count-tokens', 'POST', '/v1/messages/count_tokens', 0, NULL, false, NULL),
                ('batches', 'POST', '/v1/messages/batches', 1, 'analysis', false, 'requests'),
                ('messages', 'POST', '/v1/messages', 1, 'analysis', true, NULL)
            """)
    }

    static func burst(_ h: Harness, keys: [String], count: Int, gateways: [String]) async throws -> [Int: Int] {
        try await ConcurrencyTests.burst(h, keys: keys, count: count, gateways: gateways)
    }

    enum Limit: String, CaseIterable, Sendable {
        case companyDay, userDay, companyPeriod
    }

    @Test("a feature limit of 20 inside larger caps, 300 concurrent callers: exactly 20 admitted", arguments: Limit.allCases)
    func exactPerFeature(limit: Limit) async throws {
        try await HeavyTests.alone {
            try await Harness.with { h in
                try await h.createPlan("p", company: 1000, user: 1000)
                let (company, users) = try await h.createCompany(plan: "p", users: limit == .userDay ? 1 : 10)
                switch limit {
                case .companyDay: try await Self.seed(h, plan: "p", daily: 20)
                case .userDay: try await Self.seed(h, plan: "p", userDaily: 20)
                case .companyPeriod: try await Self.seed(h, plan: "p", period: 20)
                }
                let counts = try await Self.burst(h, keys: users.map(\.key), count: 300, gateways: [h.gatewayURL])
                #expect(counts[200] == 20)
                #expect(counts[402] == 280)
                let c = company.text
                #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == 20)
                #expect(
                    try await h.scalar(
                        "SELECT used FROM company_feature_usage WHERE company_id = '\(c)' AND feature_id = 'analysis' AND span = 'day'")
                        == 20)
                #expect(
                    try await h.scalar(
                        "SELECT sum(used) FROM user_feature_usage WHERE company_id = '\(c)' AND feature_id = 'analysis' AND span = 'period'"
                    )
                        == 20)
                #expect(
                    try await h.scalar(
                        "SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged' AND feature = 'analysis'")
                        == 20)
                #expect(h.mock.counter.count == 20)
                #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            }
        }
    }

    @Test("two gateways on one database: a feature daily limit of 25, 300 calls split between them, exactly 25 admitted")
    func exactAcrossGateways() async throws {
        try await HeavyTests.alone {
            try await Harness.with { first in
                try await first.createPlan("p", company: 1000, user: 1000)
                let (company, users) = try await first.createCompany(plan: "p", users: 10)
                try await Self.seed(first, plan: "p", daily: 25)
                try await Harness.with(database: first.databaseURL) { second in
                    let counts = try await Self.burst(
                        first, keys: users.map(\.key), count: 300, gateways: [first.gatewayURL, second.gatewayURL])
                    #expect(counts[200] == 25)
                    #expect(counts[402] == 275)
                }
                #expect(
                    try await first.scalar(
                        "SELECT used FROM company_feature_usage WHERE company_id = '\(company.text)' AND span = 'day'") == 25)
            }
        }
    }

    @Test(
        "routes: a free route changes no counter and reaches the provider; weight 3 costs 3; batches cost one unit per request and are refused whole; allowed false is 403 and reaches nothing"
    )
    func routeCosts() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 10, user: 10)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.seed(h, plan: "p")
            let key = users[0].key
            let c = company.text
            func used() async throws -> Int64 {
                try await h.scalar("SELECT coalesce(sum(used), 0) FROM company_usage WHERE company_id = '\(c)'")
            }

            // Free: GET /v1/models (prefix) and count_tokens, forwarded and in the ledger with 0 units.
            let models = try await h.request(.GET, "/v1/models", headers: [("x-api-key", key)])
            #expect(models.status == 200)
            let oneModel = try await h.request(.GET, "/v1/models/claude-test", headers: [("x-api-key", key)])
            #expect(oneModel.status == 200)
            let count = try await h.request(
                .POST, "/v1/messages/count_tokens", headers: [("x-api-key", key)], json: .obj(["model": "m", "messages": .array([])]))
            #expect(count.status == 200)
            #expect(try await used() == 0)
            #expect(try await h.scalar("SELECT coalesce(sum(used), 0) FROM company_feature_usage WHERE company_id = '\(c)'") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND units = 0") == 3)
            #expect(h.mock.counter.count == 3)

            // Weight 3.
            try await h.exec("INSERT INTO routes (id, method, path, units) VALUES ('heavy', '*', '/v1/heavy', 3)")
            let heavy = try await h.request(.POST, "/v1/heavy", headers: [("x-api-key", key)], json: .obj(["x": 1]))
            #expect(heavy.status == 200)
            #expect(try await used() == 3)

            // Batches: units per element of "requests", charged to the feature.
            func batch(_ n: Int) async throws -> Harness.Reply {
                try await h.request(
                    .POST, "/v1/messages/batches", headers: [("x-api-key", key)],
                    json: .obj(["requests": .array((0..<n).map { .obj(["custom_id": .string("r\($0)")]) })]))
            }
            #expect(try await batch(4).status == 200)
            #expect(try await used() == 7)
            #expect(
                try await h.scalar("SELECT used FROM company_feature_usage WHERE company_id = '\(c)' AND span = 'period'") == 4)
            let tooMany = try await batch(4)  // 7 + 4 > 10: refused whole
            #expect(tooMany.status == 402)
            #expect(tooMany.json["error"]?["type"]?.stringValue == "usage_cap_exceeded")
            // Not "used all": 3 are left, fewer than the call's 4.
            let message = tooMany.json["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("used 7 of the 10") && message.contains("needs more than what is left"), "\(message)")
            #expect(try await used() == 7)
            let empty = try await batch(0)
            #expect(empty.status == 400)
            let notArray = try await h.request(
                .POST, "/v1/messages/batches", headers: [("x-api-key", key)], json: .obj(["requests": "all of them"]))
            #expect(notArray.status == 400)
            #expect(try await used() == 7)

            // Not allowed: 403, nothing forwarded, nothing charged.
            try await h.exec("INSERT INTO routes (id, method, path, allowed) VALUES ('files', '*', '/v1/files*', false)")
            let served = h.mock.counter.count
            let files = try await h.request(.GET, "/v1/files/abc", headers: [("x-api-key", key)])
            #expect(files.status == 403)
            #expect(files.json["error"]?["type"]?.stringValue == "permission_error")
            #expect(h.mock.counter.count == served)
            #expect(try await used() == 7)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test(
        "a hostile client: CapGate-Feature is honoured only where the route allows it, an unknown one is 400, dotted or escaped paths cannot reach a free route, case does not dodge a route"
    )
    func hostileInputs() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.seed(h, plan: "p", daily: 4)
            try await h.exec("INSERT INTO plan_features (plan_id, feature_id) VALUES ('p', 'chat')")
            let key = users[0].key
            let c = company.text
            func featureUsed(_ feature: String) async throws -> Int64 {
                try await h.scalar(
                    "SELECT coalesce(sum(used), 0) FROM company_feature_usage WHERE company_id = '\(c)' AND feature_id = '\(feature)' AND span = 'day'"
                )
            }
            // /v1/messages allows the header: chat is charged instead of analysis.
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "chat")]).status == 200)
            #expect(try await featureUsed("chat") == 1)
            // Unknown or malformed: 400, nothing charged, nothing forwarded.
            let served = h.mock.counter.count
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "nope")]).status == 400)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "Bad Name!")]).status == 400)
            try await h.exec("UPDATE features SET is_active = false WHERE id = 'chat'")
            let inactive = try await h.message(key: key, headers: [("CapGate-Feature", "chat")])
            #expect(inactive.status == 400)
            #expect(h.mock.counter.count == served)
            // The batches route does not take the header: it is ignored, the route's feature is charged.
            let batch = try await h.request(
                .POST, "/v1/messages/batches", headers: [("x-api-key", key), ("CapGate-Feature", "chat")],
                json: .obj(["requests": .array([.obj(["custom_id": "a"])])]))
            #expect(batch.status == 200)
            #expect(try await featureUsed("analysis") == 1)
            #expect(try await featureUsed("chat") == 1)
            // Dot segments are resolved before matching (and the resolved path is what is
            // forwarded): a free prefix cannot be climbed out of. Sent raw: an HTTP client library
            // would tidy the path first.
            let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
            for (path, status) in [("/v1/models/../messages", 200), ("/v1/models/%2e%2e/messages", 200)] {
                let connection = try await RawConnection.open(port: port)
                defer { connection.close() }
                try await connection.send(
                    "POST \(path) HTTP/1.1\r\nhost: x\r\nx-api-key: \(key)\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                )
                #expect(await connection.answer(within: .seconds(10))?.status == status, "\(path)")
            }
            #expect(try await featureUsed("analysis") == 3)
            // A path another server could read differently: refused before anything is charged.
            for path in ["/v1//messages", "/v1/models/%6Dessages", "/v1/models;/x", "/v1/models#/../../v1/messages"] {
                let connection = try await RawConnection.open(port: port)
                defer { connection.close() }
                try await connection.send(
                    "POST \(path) HTTP/1.1\r\nhost: x\r\nx-api-key: \(key)\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                )
                let answer = await connection.answer(within: .seconds(10))
                #expect(answer?.status == 400, "\(path): \(answer?.head ?? "no answer")")
            }
            #expect(h.mock.counter.count == served + 3)
            // Case and a trailing slash still meet the metered route (its daily limit of 4 holds).
            #expect(try await h.request(.POST, "/v1/Messages/", headers: [("x-api-key", key)], json: .obj(["x": 1])).status == 200)
            #expect(try await featureUsed("analysis") == 4)
            let over = try await h.request(.POST, "/v1/MESSAGES", headers: [("x-api-key", key)], json: .obj(["x": 1]))
            #expect(over.status == 402)
            #expect(over.json["error"]?["type"]?.stringValue == "feature_limit_exceeded")
            // The header never reaches the provider.
            let echo = try await h.request(.POST, "/v1/echo", headers: [("x-api-key", key), ("CapGate-Feature", "chat")], json: .obj([:]))
            #expect(echo.status == 200)
            #expect(echo.json["header_names"]?.arrayValue?.contains(.string("capgate-feature")) == false)
        }
    }

    @Test(
        "refusals: 402 feature_limit_exceeded and feature_not_in_plan with the usage.feature object, upgrade, Retry-After and RateLimit policies"
    )
    func refusals() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100, sort: 1)
            try await h.createPlan("bigger", company: 100, user: 100, sort: 2)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.seed(h, plan: "p", daily: 1, userPeriod: 50)
            try await h.exec(
                "INSERT INTO plan_features (plan_id, feature_id, daily_limit) VALUES ('bigger', 'analysis', 10), ('bigger', 'chat', NULL)")
            try await h.exec("UPDATE companies SET time_zone = 'America/New_York' WHERE id = '\(company.text)'")
            let key = users[0].key
            let first = try await h.message(key: key)
            #expect(first.status == 200)
            let policy = first.headers.first(name: "ratelimit-policy") ?? ""
            #expect(policy.contains("\"feature.analysis.day\";q=1;w="))
            #expect(policy.contains("\"feature.analysis.user-period\";q=50;w="))
            #expect(first.headers.first(name: "ratelimit")?.contains("\"feature.analysis.day\";r=0;t=") == true)

            let refused = try await h.message(key: key)
            #expect(refused.status == 402)
            let error = refused.json["error"]
            #expect(error?["type"]?.stringValue == "feature_limit_exceeded")
            let feature = refused.json["usage"]?["feature"]
            #expect(feature?["id"]?.stringValue == "analysis")
            #expect(feature?["name"]?.stringValue == "Analysis")
            #expect(feature?["window"]?.stringValue == "day")
            #expect(feature?["scope"]?.stringValue == "company")
            #expect(feature?["used"]?.intValue == 1)
            #expect(feature?["limit"]?.intValue == 1)
            #expect(feature?["remaining"]?.intValue == 0)
            let resetAt = try #require(feature?["reset_at"]?.stringValue)
            let expected = try await h.text(
                "SELECT to_char(capgate_day_end(now(), 'America/New_York') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
            #expect(resetAt == expected)
            #expect(refused.json["usage"]?["upgrade"]?["plan"]?.stringValue == "bigger")
            #expect(refused.json["usage"]?["upgrade"]?["feature_limit"]?.intValue == 10)
            let retry = Int(refused.headers.first(name: "retry-after") ?? "") ?? 0
            #expect(retry > 0 && retry <= 25 * 3600)

            // The entitlement's message is used when set; a feature not in the plan is its own 402.
            try await h.exec("UPDATE plan_features SET message = 'Analyses are used up for today.' WHERE plan_id = 'p'")
            #expect(try await h.message(key: key).json["error"]?["message"]?.stringValue == "Analyses are used up for today.")
            let notInPlan = try await h.message(key: key, headers: [("CapGate-Feature", "chat")])
            #expect(notInPlan.status == 402)
            #expect(notInPlan.json["error"]?["type"]?.stringValue == "feature_not_in_plan")
            #expect(notInPlan.json["usage"]?["feature"]?["id"]?.stringValue == "chat")
            #expect(notInPlan.json["usage"]?["upgrade"]?["plan"]?.stringValue == "bigger")
            #expect(notInPlan.headers.first(name: "retry-after") != nil)
            // Its usage shows the counters as they stand (one call charged), on both admission
            // paths: the batch, and the single call an Idempotency-Key takes.
            for headers in [[("CapGate-Feature", "chat")], [("CapGate-Feature", "chat"), ("Idempotency-Key", "not-in-plan")]] {
                let usage = try await h.message(key: key, headers: headers).json["usage"]
                #expect(usage?["company"]?["used"]?.intValue == 1, "\(headers)")
                #expect(usage?["company"]?["remaining"]?.intValue == 99, "\(headers)")
                #expect(usage?["user"]?["used"]?.intValue == 1, "\(headers)")
            }
            #expect(h.mock.counter.count == 1)
        }
    }

    @Test("operator changes apply to the next request on every gateway: a limit lowered, a feature disabled, a route added")
    func changesApplyNextRequest() async throws {
        try await Harness.with { first in
            try await first.createPlan("p", company: 100, user: 100)
            let (company, users) = try await first.createCompany(plan: "p", users: 1)
            try await Self.seed(first, plan: "p", daily: 10)
            let key = users[0].key
            try await Harness.with(database: first.databaseURL) { second in
                // Both gateways have matched calls (and cached the table).
                #expect(try await first.message(key: key).status == 200)
                #expect(try await first.message(key: key, base: second.gatewayURL).status == 200)
                try await first.exec("UPDATE plan_features SET daily_limit = 2 WHERE plan_id = 'p'")
                #expect(try await first.message(key: key, base: second.gatewayURL).status == 402)
                try await first.exec("UPDATE plan_features SET daily_limit = NULL, enabled = false WHERE plan_id = 'p'")
                let disabled = try await first.message(key: key)
                #expect(disabled.json["error"]?["type"]?.stringValue == "feature_not_in_plan")
                // A route added on the database: the next call on the other gateway costs what it says.
                try await first.exec("INSERT INTO routes (id, method, path, units) VALUES ('cheap', 'POST', '/v1/messages/cheap', 0)")
                let before = try await first.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'")
                let cheap = try await first.request(
                    .POST, "/v1/messages/cheap", headers: [("x-api-key", key)], json: .obj(["x": 1]), base: second.gatewayURL)
                #expect(cheap.status == 200)
                #expect(try await first.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == before)
                try await first.exec("DELETE FROM routes")
                // No routes at all: every call is 1 unit and no feature again (SPEC §2).
                #expect(try await first.message(key: key, base: second.gatewayURL).status == 200)
                #expect(try await first.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == before + 1)
            }
        }
    }

    @Test("days in America/New_York across the March and November DST changes (23- and 25-hour days), single and batched paths")
    func daylightSaving() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1000, user: 1000)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.seed(h, plan: "p", daily: 1)
            let c = company.text
            let u = users[0].id.text
            try await h.exec(
                """
                UPDATE companies SET time_zone = 'America/New_York' WHERE id = '\(c)';
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                VALUES ('\(c)', 'p', '2027-01-01T00:00:00Z', '2028-01-01T00:00:00Z', '2027-01-01T00:00:00Z')
                """)
            func charge(_ at: String) async throws -> String? {
                try await h.text(
                    "SELECT (capgate_charge('\(c)', '\(u)', 1, 'POST', '/v1/messages', NULL, 'analysis', 'r', NULL, '\(at)')).decision")
            }
            func batch(_ at: String) async throws -> String? {
                try await h.text(
                    """
                    SELECT string_agg(decision, ',' ORDER BY item) FROM capgate_admit_batch(
                        ARRAY[''::bytea, ''], ARRAY['\(c)', '\(c)']::uuid[], ARRAY['\(u)', '\(u)']::uuid[], ARRAY[1, 1],
                        ARRAY['POST', 'POST'], ARRAY['/v1/messages', '/v1/messages'], ARRAY['', ''], ARRAY['analysis', 'analysis'],
                        ARRAY['b1', 'b2'], ARRAY[-1, -1]::bigint[], ARRAY['\(at)'::timestamptz, '\(at)'::timestamptz], false,
                        ARRAY[-2, -2]::bigint[], ARRAY[-1, -1]::bigint[], ARRAY[0, 0]::smallint[], ARRAY[0, 0]::bigint[])
                    """)
            }
            // March 14, 2027 in New York runs from 05:00Z to 04:00Z the next day: 23 hours.
            #expect(try await charge("2027-03-14T04:59:00Z") == "charged")  // Mar 13, 23:59 EST
            #expect(try await charge("2027-03-14T05:00:00Z") == "charged")  // Mar 14, 00:00 EST
            #expect(try await charge("2027-03-15T03:59:00Z") == "feature_limit_exceeded")  // Mar 14, 23:59 EDT
            #expect(try await batch("2027-03-15T04:00:00Z") == "charged,feature_limit_exceeded")  // Mar 15, 00:00 EDT
            // November 7, 2027 runs from 04:00Z to 05:00Z the next day: 25 hours.
            #expect(try await charge("2027-11-07T04:00:00Z") == "charged")  // Nov 7, 00:00 EDT
            #expect(try await batch("2027-11-08T04:30:00Z") == "feature_limit_exceeded,feature_limit_exceeded")  // Nov 7, 23:30 EST
            #expect(try await charge("2027-11-08T05:00:00Z") == "charged")  // Nov 8, 00:00 EST
            let lengths = try await h.text(
                """
                SELECT string_agg(extract(epoch FROM ends_at - starts_at)::bigint::text, ',' ORDER BY starts_at)
                  FROM company_feature_usage WHERE company_id = '\(c)' AND span = 'day'
                """)
            #expect(lengths == "86400,82800,86400,90000,86400")
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("a refund gives back every counter the call charged: company, user and the feature's day and period windows")
    func refundGivesBackFeatureCounters() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.seed(h, plan: "p", daily: 5)
            let failed = try await h.message(key: users[0].key, headers: [("x-mock-status", "529")])
            #expect(failed.status == 529)
            let c = company.text
            #expect(try await h.scalar("SELECT coalesce(sum(used), 0) FROM company_feature_usage WHERE company_id = '\(c)'") == 0)
            #expect(try await h.scalar("SELECT coalesce(sum(used), 0) FROM user_feature_usage WHERE company_id = '\(c)'") == 0)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == 0)
            #expect(try await h.text("SELECT outcome FROM usage_ledger WHERE company_id = '\(c)'") == "refunded")
        }
    }
}
