import AsyncHTTPClient
import CapGate
import CapGateDev
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@Suite("Metered proxy", .timeLimit(.minutes(5)))
struct ProxyTests {
    @Test("a call is forwarded with the provider key, charged once, and carries usage headers")
    func forwardsAndCharges() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let reply = try await h.message(key: users[0].key)
            #expect(reply.status == 200)
            #expect(reply.json["content"]?.arrayValue?.first?["text"]?.stringValue == "Hello from the mock provider.")
            #expect(reply.headers.first(name: "request-id")?.hasPrefix("req_") == true)
            #expect(reply.headers.first(name: "RateLimit-Policy")?.hasPrefix("\"company\";q=100;w=") == true)
            #expect(reply.headers.first(name: "RateLimit")?.contains("\"company\";r=99;t=") == true)
            #expect(reply.headers.first(name: "RateLimit")?.contains("\"user\";r=24;t=") == true)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            let requestID = reply.headers.first(name: "request-id")!
            #expect(
                try await h.eventually(
                    "SELECT count(*) FROM usage_ledger WHERE request_id = '\(requestID)' AND outcome = 'charged' AND input_tokens > 0 AND output_tokens = 7 AND upstream_status = 200 AND model = 'claude-test'",
                    equals: 1
                ) == 1)

            // What reached the provider: its key, not the client's credentials.
            let echo = try await h.request(
                .GET, "/v1/echo/anything?x=1", headers: [("x-api-key", users[0].key), ("authorization", "Bearer \(users[0].key)")])
            #expect(echo.status == 200)
            #expect(echo.json["x_api_key"]?.stringValue == "provider-secret-key")
            #expect(echo.json["authorization"]?.isNull == true)
            #expect(echo.json["path"]?.stringValue == "/v1/echo/anything")
            #expect(echo.json["query"]?.stringValue == "x=1")
            #expect(echo.body.contains(users[0].key) == false)
        }
    }

    @Test("with proxy.prefix '/', CapGate's own routes are still answered by CapGate; everything else is forwarded")
    func rootPrefix() async throws {
        try await Harness.with(settings: ["proxy.prefix": "/"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.request(.GET, "/healthz").json["status"]?.stringValue == "ok")
            #expect(try await h.request(.GET, "/readyz").status == 200)
            #expect(try await h.op(.GET, "/admin/v1/plans").json["data"]?.arrayValue?.count == 1)
            #expect(try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)]).json["company"]?["used"]?.intValue == 1)
            #expect(try await h.request(.GET, "/metrics", headers: h.asOperator).body.contains("capgate_requests_total"))
            #expect(try await h.request(.GET, "/v1/models", headers: [("x-api-key", users[0].key)]).status == 200)
        }
    }

    @Test("/metrics has what SPEC §7 names: requests by route, status and decision; admission and upstream latency; refunds; pool state")
    func metrics() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.message(key: users[0].key, headers: [("x-mock-status", "500")]).status == 500)
            let text = try await h.request(.GET, "/metrics", headers: h.asOperator).body
            for family in [
                #"capgate_requests_total{route="/v1/messages",status="200",decision="charged"}"#,
                #"capgate_requests_total{route="/v1/messages",status="500",decision="refunded"}"#,
                "capgate_admission_duration_seconds_bucket{", "capgate_upstream_duration_seconds_bucket{",
                #"capgate_refunds_total{reason="#, "capgate_db_pool_max_connections ", "capgate_db_operations_in_flight ",
                "capgate_db_unavailable_total ", "capgate_inflight_requests ",
            ] {
                #expect(text.contains(family), "missing \(family)")
            }
        }
    }

    @Test("request ids: req_ and 24 hex digits, distinct across many concurrent calls, the same in the ledger")
    func requestIDs() async throws {
        try await Harness.with { h in
            try await h.createPlan("wide", company: 1_000, user: 1_000)
            let (company, users) = try await h.createCompany(plan: "wide", users: 1)
            let ids = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<60 {
                    group.addTask {
                        let reply = try await h.message(key: users[0].key)
                        return reply.headers.first(name: "request-id") ?? ""
                    }
                }
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
            let hex = Set("0123456789abcdef")
            #expect(ids.allSatisfy { $0.hasPrefix("req_") && $0.count == 28 && $0.dropFirst(4).allSatisfy(hex.contains) })
            #expect(Set(ids).count == 60)
            let listed = ids.map { "'\($0)'" }.joined(separator: ",")
            #expect(
                try await h.scalar(
                    "SELECT count(DISTINCT request_id) FROM usage_ledger WHERE company_id = '\(company.text)' AND request_id IN (\(listed))"
                ) == 60)
        }
    }

    @Test("a streamed answer reaches the client event by event, before the provider finishes")
    func streamsIncrementally() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            let request = h.streamingRequest(
                key: users[0].key, headers: [("x-mock-chunk-delay-ms", "300")],
                body: #"{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
            )
            let started = ContinuousClock.now
            let response = try await Harness.http.execute(request, timeout: .seconds(30))
            #expect(response.status == .ok)
            #expect(response.headers.first(name: "content-type")?.hasPrefix("text/event-stream") == true)
            var firstEventAt: Duration?
            var text = ""
            for try await chunk in response.body {
                if firstEventAt == nil { firstEventAt = ContinuousClock.now - started }
                text += String(buffer: chunk)
            }
            let total = ContinuousClock.now - started
            // 10 events 300 ms apart: the first must arrive long before the last (measured from
            // the end, so a slow start on a loaded machine does not count against it).
            #expect(firstEventAt! < total - .milliseconds(1500), "first event at \(firstEventAt!), all at \(total)")
            #expect(total > .milliseconds(2500))
            #expect(text.contains("event: message_stop"))
            // The mock bills at most max_tokens (5) of output.
            #expect(
                try await h.eventually("SELECT count(*) FROM usage_ledger WHERE output_tokens = 5 AND input_tokens > 0", equals: 1) == 1)
        }
    }

    @Test("over the company cap: 402 usage_cap_exceeded with the usage object, nothing forwarded")
    func companyCap() async throws {
        try await Harness.with { h in
            try await h.createPlan("tiny", company: 2, user: 10, sort: 1)
            try await h.createPlan("big", company: 50, user: 20, sort: 2)
            let (company, users) = try await h.createCompany(plan: "tiny", users: 2)
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.message(key: users[1].key).status == 200)
            let forwarded = h.mock.counter.count
            let denied = try await h.message(key: users[0].key)
            #expect(denied.status == 402)
            #expect(h.mock.counter.count == forwarded)
            let body = denied.json
            #expect(body["type"]?.stringValue == "error")
            #expect(body["error"]?["type"]?.stringValue == "usage_cap_exceeded")
            #expect(body["error"]?["message"]?.stringValue?.isEmpty == false)
            #expect(body["usage"]?["scope"]?.stringValue == "company")
            #expect(body["usage"]?["plan"]?["id"]?.stringValue == "tiny")
            #expect(body["usage"]?["company"]?["used"]?.intValue == 2)
            #expect(body["usage"]?["company"]?["limit"]?.intValue == 2)
            #expect(body["usage"]?["company"]?["remaining"]?.intValue == 0)
            #expect(body["usage"]?["user"]?["used"]?.intValue == 1)
            #expect(body["usage"]?["upgrade"]?["plan"]?.stringValue == "big")
            #expect(body["usage"]?["upgrade"]?["company_limit"]?.intValue == 50)
            #expect(body["usage"]?["period"]?["start"]?.stringValue != nil)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 2)
        }
    }

    @Test("over the user cap: 402 with scope user; an override cap wins over the plan's")
    func userCap() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 1)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            let denied = try await h.message(key: users[0].key)
            #expect(denied.status == 402)
            #expect(denied.json["usage"]?["scope"]?.stringValue == "user")
            #expect(denied.json["usage"]?["upgrade"]?.isNull == true)
            let vip = try await h.createUser(company: company, cap: 3)
            for _ in 0..<3 { #expect(try await h.message(key: vip.key).status == 200) }
            #expect(try await h.message(key: vip.key).status == 402)
            // Raising the plan's cap applies to the next request, no deploy.
            #expect(try await h.op(.PUT, "/admin/v1/plans/low", .obj(["monthly_user_cap": 5])).status == 200)
            #expect(try await h.message(key: users[0].key).status == 200)
        }
    }

    @Test("no plan period: 402 no_active_plan with Retry-After; a call after the period ended opens the next one (no gap)")
    func noActivePlanAndPeriodEdge() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: nil, users: 1)
            let denied = try await h.message(key: users[0].key)
            #expect(denied.status == 402)
            #expect(denied.json["error"]?["type"]?.stringValue == "no_active_plan")
            #expect(denied.json["usage"]?["plan"]?.isNull == true)
            #expect(denied.headers.first(name: "retry-after").flatMap(Int.init) != nil)

            // A period that ended a moment ago ([start, end) excludes end): the call renews it, as
            // the rollover would, in its own admission.
            try await h.exec(
                """
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                VALUES ('\(company.text)', 'low', now() - interval '1 month', now() - interval '1 millisecond', now() - interval '1 month')
                """
            )
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2)
            #expect(
                try await h.scalar(
                    """
                    SELECT count(*) FROM usage_ledger l JOIN plan_periods p ON p.company_id = l.company_id AND p.id = l.period_id
                     WHERE p.started_at > now() - interval '1 minute' AND p.started_at >= (
                           SELECT min(ends_at) FROM plan_periods WHERE company_id = '\(company.text)')
                    """
                ) == 1)
            #expect(
                try await h.text("SELECT type FROM billing_events WHERE company_id = '\(company.text)' ORDER BY id DESC LIMIT 1")
                    == "rollover")
        }
    }

    @Test("admission SQL: the boundary instant belongs to the later period")
    func boundaryInstant() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: nil, users: 1)
            try await h.exec(
                """
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor) VALUES
                ('\(company.text)', 'low', '2026-01-01T00:00:00Z', '2026-02-01T00:00:00Z', '2026-01-01T00:00:00Z'),
                ('\(company.text)', 'low', '2026-02-01T00:00:00Z', '2026-03-01T00:00:00Z', '2026-01-01T00:00:00Z')
                """
            )
            try await h.exec(
                "SELECT capgate_charge('\(company.text)', '\(users[0].id.text)', 1, 'POST', '/v1/messages', NULL, NULL, 'r1', NULL, '2026-02-01T00:00:00Z')"
            )
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM usage_ledger l JOIN plan_periods p ON p.id = l.period_id WHERE p.started_at = '2026-02-01T00:00:00Z'"
                ) == 1)
        }
    }

    @Test("single-call admission SQL: the conditional-update path and the locking path decide the same, counters equal the ledger")
    func singleCallPaths() async throws {
        try await Harness.with { h in
            try await h.createPlan("small", company: 3, user: 2)
            let (company, users) = try await h.createCompany(plan: "small", users: 2)
            func admit(_ user: UUID) async throws -> String? {
                try await h.text(
                    "SELECT (capgate_charge('\(company.text)', '\(user.text)', 1, 'POST', '/v1/messages', NULL, NULL, 'r', NULL, now())).decision"
                )
            }
            func counters() async throws -> [Int64] {
                [
                    try await h.scalar("SELECT coalesce(sum(used), 0) FROM company_usage WHERE company_id = '\(company.text)'"),
                    try await h.scalar("SELECT coalesce(sum(used), 0) FROM user_usage WHERE user_id = '\(users[0].id.text)'"),
                    try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'"),
                ]
            }
            // No counter rows yet this period: created by the locking path, then charged.
            #expect(try await admit(users[0].id) == "charged")
            #expect(try await counters() == [1, 1, 1])
            // Both rows exist: the conditional updates charge.
            #expect(try await admit(users[0].id) == "charged")
            #expect(try await counters() == [2, 2, 2])
            // The user is at the user cap while the company has room: the company charge is given back.
            #expect(try await admit(users[0].id) == "user_cap")
            #expect(try await counters() == [2, 2, 2])
            // Another user: charged.
            #expect(try await admit(users[1].id) == "charged")
            #expect(try await counters() == [3, 2, 3])
            // The company cap: refused, nothing moves.
            #expect(try await admit(users[1].id) == "company_cap")
            #expect(try await counters() == [3, 2, 3])
            #expect(try await admit(UUID()) == "unknown_user")
            #expect(
                try await h.scalar(
                    """
                    SELECT count(*) FROM user_usage uu
                     WHERE uu.company_id = '\(company.text)'
                       AND uu.used <> (SELECT count(*) FROM usage_ledger l WHERE l.user_id = uu.user_id AND l.outcome = 'charged')
                    """
                ) == 0)
        }
    }

    @Test("a plan period with ledger rows can be neither deleted nor re-keyed; one without usage takes its counters along")
    func usedPeriodsStay() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (used, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            await #expect(throws: (any Error).self) {
                try await h.exec("DELETE FROM plan_periods WHERE company_id = '\(used.text)'")
            }
            await #expect(throws: (any Error).self) {
                try await h.exec("UPDATE plan_periods SET id = id + 1000000 WHERE company_id = '\(used.text)'")
            }
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(used.text)'") == 1)

            let (unused, others) = try await h.createCompany(plan: "low", users: 1)
            try await h.exec(
                """
                INSERT INTO user_usage (company_id, period_id, user_id, used)
                SELECT company_id, id, '\(others[0].id.text)', 0 FROM plan_periods WHERE company_id = '\(unused.text)'
                """)
            #expect(try await h.scalar("SELECT count(*) FROM company_usage WHERE company_id = '\(unused.text)'") == 1)
            try await h.exec("DELETE FROM plan_periods WHERE company_id = '\(unused.text)'")
            #expect(try await h.scalar("SELECT count(*) FROM company_usage WHERE company_id = '\(unused.text)'") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM user_usage WHERE company_id = '\(unused.text)'") == 0)
        }
    }

    @Test(
        "provider failures are refunded: 500 passes through, a closed connection is 502; a stall after the whole request was sent is 504 and stays charged (the provider may have run it)"
    )
    func refunds() async throws {
        let closer = try await ClosingServer.start()
        defer { closer.stop() }
        // upstream.timeout 3 s: a loaded machine (the full suite on 2 cores) must not turn the
        // provider's prompt 500 into a 504; the stall is well past it.
        try await Harness.with(settings: ["upstream.timeout": "3"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let failed = try await h.message(key: users[0].key, headers: [("x-mock-status", "500")])
            #expect(failed.status == 500)
            #expect(failed.json["error"]?["type"]?.stringValue == "api_error")
            let stalled = try await h.message(key: users[0].key, headers: [("x-mock-delay-ms", "8000")])
            #expect(stalled.status == 504)
            #expect(stalled.json["error"]?["type"]?.stringValue == "upstream_timeout")
            #expect(stalled.json["error"]?["message"]?.stringValue?.contains("stays counted") == true)
            // The 500 is given back; the stalled call, wholly sent, is kept and settled at its hold
            // (recorded as 504: the provider's own answer never came).
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") == 1)
            #expect(
                try await h.eventually(
                    "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND upstream_status = 504 AND settled_at IS NOT NULL",
                    equals: 1) == 1)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            #expect(try await h.scalar("SELECT COALESCE(sum(used), 0) FROM user_usage") == 1)
        }
        try await Harness.with(upstreamURL: "http://127.0.0.1:\(closer.port)") { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let broken = try await h.message(key: users[0].key)
            #expect(broken.status == 502)
            #expect(broken.json["error"]?["type"]?.stringValue == "upstream_error")
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 0)
        }
        let unusedPort = try EmbeddedPostgres.freePort()
        try await Harness.with(upstreamURL: "http://127.0.0.1:\(unusedPort)") { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 502)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 0)
        }
    }

    @Test("a 2xx answer the provider breaks off mid-body: the client gets the head and the part, the charge stands")
    func brokenOffAnswer() async throws {
        let provider = try await ClosingServer.start(truncating: true)
        defer { provider.stop() }
        try await Harness.with(upstreamURL: "http://127.0.0.1:\(provider.port)") { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            var request = HTTPClientRequest(url: h.gatewayURL + "/v1/messages")
            request.method = .POST
            request.headers.add(name: "x-api-key", value: users[0].key)
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: #"{"model":"claude-test","max_tokens":8,"messages":[]}"#))
            let response = try await Harness.http.execute(request, timeout: .seconds(30))
            #expect(response.status == .ok)
            #expect(response.headers.first(name: "content-length") == "100")
            var received = ByteBuffer()
            await #expect(throws: (any Error).self) {
                for try await chunk in response.body { received.writeImmutableBuffer(chunk) }
            }
            #expect(String(buffer: received) == #"{"id":"msg_cut""#)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            #expect(
                try await h.eventually("SELECT count(*) FROM usage_ledger WHERE upstream_status = 200 AND outcome = 'charged'", equals: 1)
                    == 1)
        }
    }

    @Test("ledger rows replayed under migration 0009 (before 0010): the charge stands until every attempt failed")
    func replayAttemptsSQL() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let user = users[0].id
            // 0009's rules, as its capgate_admit applied them: a retry with the key of a charge
            // that stands is recorded as an attempt of that charge ("replayed").
            func admit(_ requestID: String, key: String) async throws -> String {
                if let replayed = try await h.text(
                    "SELECT id::text FROM usage_ledger WHERE idempotency_key = '\(key)' AND outcome = 'charged'")
                {
                    try await h.exec(
                        "INSERT INTO usage_ledger_attempts (company_id, ledger_id, request_id) VALUES ('\(company.text)', \(replayed), '\(requestID)')"
                    )
                    return "replayed:" + replayed
                }
                let ledger =
                    try await h.text(
                        """
                        SELECT (capgate_charge('\(company.text)', '\(user.text)', 1, 'POST', '/v1/messages', NULL, NULL,
                                '\(requestID)', NULL, now())).ledger_id::text
                        """) ?? ""
                try await h.exec("UPDATE usage_ledger SET idempotency_key = '\(key)' WHERE id = \(ledger)")
                return "charged:" + ledger
            }
            func refund(_ ledger: String, _ requestID: String?) async throws -> String? {
                let id = requestID.map { "'\($0)'" } ?? "NULL"
                return try await h.text("SELECT capgate_refund('\(company.text)', \(ledger), 502, \(id))::text")
            }
            func used() async throws -> Int64 {
                try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'")
            }
            // First attempt a, replay b: b fails (twice reported), the charge stands; then a fails: given back.
            let charged = try await admit("a", key: "k1")
            let ledger = String(charged.dropFirst("charged:".count))
            #expect(charged.hasPrefix("charged:"))
            #expect(try await admit("b", key: "k1") == "replayed:\(ledger)")
            #expect(try await used() == 1)
            #expect(try await refund(ledger, "b") == "false")
            #expect(try await refund(ledger, "b") == "false")
            #expect(try await used() == 1)
            #expect(try await refund(ledger, "a") == "true")
            #expect(try await used() == 0)
            #expect(try await refund(ledger, "a") == "false")
            #expect(try await h.text("SELECT outcome FROM usage_ledger WHERE id = \(ledger)") == "refunded")

            // First attempt c fails while its replay d is in flight: the charge stands, and d's
            // success (which reports nothing) keeps it.
            let second = String(try await admit("c", key: "k2").dropFirst("charged:".count))
            #expect(try await admit("d", key: "k2") == "replayed:\(second)")
            #expect(try await refund(second, nil) == "false")  // NULL: the first attempt
            #expect(try await used() == 1)
            #expect(try await h.text("SELECT outcome FROM usage_ledger WHERE id = \(second)") == "charged")
            // A later retry still replays it, and its failure alone does not give it back.
            #expect(try await admit("e", key: "k2") == "replayed:\(second)")
            #expect(try await refund(second, "e") == "false")
            #expect(try await used() == 1)

            // Without replays a refund is what it always was.
            let plain = String(try await admit("f", key: "k3").dropFirst("charged:".count))
            #expect(try await refund(plain, "f") == "true")
            #expect(try await used() == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("credentials: none, unknown, revoked and operator-token calls are refused; a client company header is ignored")
    func credentials() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let (other, _) = try await h.createCompany(plan: "low", users: 1)
            let none = try await h.request(.POST, "/v1/messages", json: .obj(["model": "m"]))
            #expect(none.status == 401)
            #expect(none.json["error"]?["type"]?.stringValue == "authentication_error")
            #expect(try await h.message(key: "cg_not-a-real-key").status == 401)
            #expect(try await h.request(.POST, "/v1/messages", headers: [("authorization", "Basic abc")]).status == 401)
            #expect(try await h.message(key: users[0].key, headers: [("x-company-id", other.text)]).status == 200)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            #expect(try await h.scalar("SELECT COALESCE(sum(used), 0) FROM company_usage WHERE company_id = '\(other.text)'") == 0)
            // Bearer with a CapGate key works like x-api-key.
            #expect(try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(users[0].key)")]).status == 200)
            // Revocation takes effect on the next request.
            let keys = try await h.op(.GET, "/admin/v1/companies/\(company.text)/api-keys")
            let keyID = keys.json["data"]!.arrayValue![0]["id"]!.stringValue!
            #expect(try await h.op(.DELETE, "/admin/v1/companies/\(company.text)/api-keys/\(keyID)").status == 200)
            let revoked = try await h.message(key: users[0].key)
            #expect(revoked.status == 401)
            #expect(revoked.json["error"]?["message"]?.stringValue?.contains("revoked") == true)
            #expect(try await h.request(.POST, "/v1/messages", headers: h.asOperator, json: .obj(["model": "m"])).status == 403)
        }
    }

    @Test("a body over proxy.maxBodyBytes is 413 and charges nothing")
    func bodyLimit() async throws {
        try await Harness.with(settings: ["proxy.maxBodyBytes": "1000"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let big = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", users[0].key), ("content-type", "application/json")],
                body: "{\"model\":\"m\",\"pad\":\"" + String(repeating: "x", count: 5000) + "\"}"
            )
            #expect(big.status == 413)
            #expect(big.json["error"]?["type"]?.stringValue == "request_too_large")
            #expect(try await h.scalar("SELECT COALESCE(sum(used), 0) FROM company_usage WHERE company_id = '\(company.text)'") == 0)
        }
    }

    @Test("GET /v1/usage and /v1/usage/check report and dry-run without recording")
    func usageRoutes() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 10, user: 3)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            _ = try await h.message(key: users[0].key)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)])
            #expect(usage.status == 200)
            #expect(usage.json["scope"]?.stringValue == "user")
            #expect(usage.json["user"]?["used"]?.intValue == 1)
            #expect(usage.json["user"]?["remaining"]?.intValue == 2)
            #expect(usage.json["company"]?["limit"]?.intValue == 10)
            let ok = try await h.request(.GET, "/v1/usage/check?units=2", headers: [("x-api-key", users[0].key)])
            #expect(ok.json["allowed"]?.boolValue == true)
            #expect(ok.json["reason"]?.isNull == true)
            let no = try await h.request(.GET, "/v1/usage/check?units=3", headers: [("x-api-key", users[0].key)])
            #expect(no.json["allowed"]?.boolValue == false)
            #expect(no.json["reason"]?.stringValue == "usage_cap_exceeded")
            #expect(no.json["usage"]?["scope"]?.stringValue == "user")
            #expect(try await h.request(.GET, "/v1/usage/check?units=abc", headers: [("x-api-key", users[0].key)]).status == 400)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
        }
    }
}
