import Foundation
import Testing

@testable import CapGate

/// SPEC §10: the usage console's files, its daily read, and the page itself in a real headless
/// Chromium driven by Selenium against the real gateway and database.
@Suite("Usage console", .timeLimit(.minutes(5)))
struct ConsoleTests {
    @Test("the page's files: content types, a strict Content-Security-Policy, no caching of stale code; nothing else is served")
    func files() async throws {
        try await Harness.with { h in
            let scripts = ConsoleRoutes.scripts.map { ("/console/" + $0, "text/javascript") }
            for (path, type) in [("/console", "text/html"), ("/console/index.html", "text/html"), ("/console/console.css", "text/css")]
                + scripts
            {
                let reply = try await h.request(.GET, path)
                #expect(reply.status == 200, "\(path)")
                #expect(reply.headers.first(name: "content-type")?.hasPrefix(type) == true, "\(path)")
                let csp = reply.headers.first(name: "content-security-policy") ?? ""
                #expect(csp.contains("default-src 'none'") && csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"))
                #expect(!csp.contains("unsafe-inline") && !csp.contains("http"))
                #expect(reply.headers.first(name: "cache-control") == "no-cache")
                #expect(reply.headers.first(name: "x-content-type-options") == "nosniff")
            }
            let page = try await h.request(.GET, "/console").body
            // Nothing off the machine: no absolute URL to another host, no inline script or style.
            #expect(!page.contains("http://") && !page.contains("https://") && !page.contains("//cdn"))
            #expect(!page.contains("<script>") && !page.contains("style=") && !page.contains("onclick"))
            // Every script the page loads is one the gateway serves, and none writes HTML or keeps the key elsewhere.
            for name in ConsoleRoutes.scripts {
                #expect(page.contains("<script src=\"/console/\(name)\" defer></script>"), "\(name) is not loaded by the page")
                let script = try await h.request(.GET, "/console/" + name).body
                #expect(!script.contains("innerHTML") && !script.contains("outerHTML") && !script.contains("insertAdjacentHTML"), "\(name)")
                #expect(!script.contains("localStorage") && !script.contains("document.cookie") && !script.contains("eval("), "\(name)")
            }
            #expect(page.components(separatedBy: "<script").count - 1 == ConsoleRoutes.scripts.count)
            for path in ["/console/Package.swift", "/console/..%2FPackage.swift", "/console/%2e%2e", "/console/x.js"] {
                let reply = try await h.request(.GET, path)
                #expect(reply.status == 404 || reply.status == 400, "\(path): \(reply.status)")
                #expect(!reply.body.contains("swift-tools-version"))
            }
        }
    }

    @Test(
        "/usage/daily: days in the company's zone, every day of the range, split by feature; refunds not counted; 400 for bad from/to; other tenants get 403"
    )
    func daily() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1000, user: nil)
            let (a, aUsers) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            let (b, bUsers) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            try await h.exec("INSERT INTO features (id, name) VALUES ('chat', 'Chat')")
            for _ in 0..<4 { #expect(try await h.message(key: aUsers[1].key).status == 200) }
            #expect(try await h.message(key: bUsers[0].key).status == 200)
            // Four ledger rows of A placed around New York's midnight of 7/8 March 2026 (EST, UTC-5).
            try await h.exec(
                """
                UPDATE companies SET time_zone = 'America/New_York' WHERE id = '\(a.text)';
                WITH r AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM usage_ledger WHERE company_id = '\(a.text)')
                UPDATE usage_ledger l SET created_at = CASE r.n WHEN 1 THEN timestamptz '2026-03-08 04:30:00+00'
                                                               WHEN 2 THEN timestamptz '2026-03-08 05:30:00+00'
                                                               WHEN 3 THEN timestamptz '2026-03-08 06:00:00+00'
                                                               ELSE timestamptz '2026-03-10 03:00:00+00' END,
                                          feature = CASE WHEN r.n = 3 THEN 'chat' END,
                                          outcome = CASE WHEN r.n = 4 THEN 'refunded' ELSE outcome END
                  FROM r WHERE l.company_id = '\(a.text)' AND l.id = r.id
                """)
            let path = "/admin/v1/companies/\(a.text)/usage/daily"
            let asAdmin = [("x-api-key", aUsers[0].key)]
            let reply = try await h.request(.GET, path + "?from=2026-03-07&to=2026-03-09", headers: asAdmin)
            #expect(reply.status == 200, "\(reply.body)")
            let days = reply.json.arrayValue ?? []
            #expect(days.compactMap { $0["date"]?.stringValue } == ["2026-03-07", "2026-03-08", "2026-03-09"])
            #expect(days.compactMap { $0["units"]?.intValue } == [1, 2, 0])
            #expect(days[1]["features"]?["chat"]?.intValue == 1)
            #expect(days[0]["features"] == .obj([:]))
            // A time instead of a day means that time's day in the zone; the refunded call counts nothing.
            let times = try await h.request(.GET, path + "?from=2026-03-08T04:00:00Z&to=2026-03-10T12:00:00Z", headers: asAdmin)
            #expect(times.json.arrayValue?.compactMap { $0["units"]?.intValue } == [1, 2, 0, 0])
            // In UTC the same rows are one day.
            try await h.exec("UPDATE companies SET time_zone = 'UTC' WHERE id = '\(a.text)'")
            let utc = try await h.request(.GET, path + "?from=2026-03-07&to=2026-03-09", headers: asAdmin).json.arrayValue ?? []
            #expect(utc.compactMap { $0["units"]?.intValue } == [0, 3, 0])
            // Default: the current period's days up to today.
            let current = try await h.request(.GET, path, headers: asAdmin).json.arrayValue ?? []
            #expect(current.count >= 1)
            // Only `to`, before the current period: the 30 days ending there, not a 400.
            let before = try await h.request(.GET, path + "?to=2026-03-09", headers: asAdmin)
            #expect(before.status == 200, "\(before.body)")
            let lastThirty = before.json.arrayValue?.compactMap { $0["date"]?.stringValue } ?? []
            #expect(lastThirty.count == 30 && lastThirty.first == "2026-02-08" && lastThirty.last == "2026-03-09")

            for bad in [
                "from=2026-02-30", "from=yesterday", "to=2026-13-01", "from=2026-03-09&to=2026-03-07", "from=2020-01-01&to=2026-01-01",
                "from=1'--",
            ] {
                let r = try await h.request(.GET, path + "?" + bad, headers: asAdmin)
                #expect(r.status == 400, "\(bad): \(r.status) \(r.body)")
                #expect(r.json["error"]?["type"]?.stringValue == "invalid_request_error")
            }
            // B's admin, A's member and nobody learn nothing of A; the operator reads it.
            let other = try await h.request(.GET, path, headers: [("x-api-key", bUsers[0].key)])
            #expect(other.status == 403)
            #expect(try await h.request(.GET, path, headers: [("x-api-key", aUsers[1].key)]).status == 403)
            #expect(try await h.request(.GET, path).status == 401)
            #expect(try await h.op(.GET, path + "?from=2026-03-07&to=2026-03-09").json.arrayValue?.count == 3)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(UUID().uuidString)/usage/daily").status == 404)
            // Who am I: the console's first call.
            let me = try await h.request(.GET, "/admin/v1/me", headers: asAdmin).json
            #expect(me["role"]?.stringValue == "admin" && me["company_id"]?.stringValue == a.text)
            #expect(try await h.op(.GET, "/admin/v1/me").json["role"]?.stringValue == "operator")
            _ = b
        }
    }

    @Test(
        "in a real Chromium: sign in as admin and see the API's numbers, one bar per day with data, CSV download, sign-out; a member refused; A cannot open B; the operator's list sorts; no request off the gateway"
    )
    func browser() async throws {
        let python = try await PythonTools.python()
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium"), "apt-get install -y chromium chromium-driver")
        try await Harness.with { h in
            try await h.createPlan("low", company: 40, user: 20)
            let start = Timestamp.format(Date().addingTimeInterval(-6 * 86400))
            let (a, aUsers) = try await h.createCompany(plan: "low", users: 4, role: "admin", startedAt: start)
            let (b, _) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            try await h.exec(
                "UPDATE companies SET name = 'Acme Skin' WHERE id = '\(a.text)'; UPDATE companies SET name = 'Beta Labs' WHERE id = '\(b.text)'"
            )
            // The plan sells one feature, which every message uses.
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis"])).status == 201)
            #expect(
                try await h.op(.PUT, "/admin/v1/plans/low/entitlements/analysis", .obj(["daily_limit": 1000, "user_period_limit": 500]))
                    .status == 201)
            #expect(
                try await h.op(.POST, "/admin/v1/routes", .obj(["method": "POST", "path": "/v1/messages", "feature": "analysis"])).status
                    == 201)
            for i in 0..<33 { #expect(try await h.message(key: aUsers[i % 4].key).status == 200) }
            // The states a person meets: a company with no plan, one at its cap.
            try await h.createPlan("tiny", company: 2, user: nil)
            #expect(try await h.op(.PUT, "/admin/v1/plans/tiny/entitlements/analysis", .obj([:])).status == 201)
            let (noPlan, _) = try await h.createCompany(plan: nil, users: 1)
            let (full, fullUsers) = try await h.createCompany(plan: "tiny", users: 1)
            for _ in 0..<3 { _ = try await h.message(key: fullUsers[0].key) }
            try await h.createPlan("endless", company: nil, user: nil)
            let (unlimited, _) = try await h.createCompany(plan: "endless", users: 1)
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(unlimited.text)", .obj(["name": "Epsilon Unlimited"])).status == 200)
            try await h.exec(
                "UPDATE companies SET name = 'Gamma Planless' WHERE id = '\(noPlan.text)'; UPDATE companies SET name = 'Delta Full' WHERE id = '\(full.text)'"
            )
            // Spread the calls over the last days of the period (several bars).
            try await h.exec(
                """
                UPDATE usage_ledger SET created_at = created_at - ((id % 4) || ' days')::interval
                 WHERE company_id = '\(a.text)'
                """)
            // Cost budgets (SPEC §11): admission does not price calls yet, so the money is written
            // here, once the gateway has written the calls' answers: budgets on the plan and one
            // user, spend on the counters, two models on the ledger (most calls settled, some held).
            try await CostReadTests.settled(h, a)
            try await h.exec(
                """
                UPDATE plans SET monthly_company_budget = 50000000, monthly_user_budget = 10000000 WHERE id = 'low';
                UPDATE users SET monthly_budget = 2500000 WHERE id = '\(aUsers[1].id.text)';
                UPDATE company_usage SET cost_used = 12345678, cost_held = 1500000 WHERE company_id = '\(a.text)';
                UPDATE user_usage SET cost_used = 2600000 WHERE company_id = '\(a.text)' AND user_id = '\(aUsers[1].id.text)';
                UPDATE user_usage SET cost_used = 4000000, cost_held = 1500000
                 WHERE company_id = '\(a.text)' AND user_id = '\(aUsers[2].id.text)';
                UPDATE usage_ledger SET model = CASE WHEN id % 3 = 0 THEN 'claude-haiku-4-5' ELSE 'claude-sonnet-4-5' END,
                       cache_write_5m_tokens = id % 4, cache_read_tokens = id % 5, hold_micros = 2000000,
                       cost_micros = CASE WHEN id % 7 <> 0 THEN 100000 + id END, cost_source = CASE WHEN id % 7 <> 0 THEN 'usage' END
                 WHERE company_id = '\(a.text)';
                """)
            let folder = SDKTests.root.appendingPathComponent(".build/console-screenshots").path
            let downloads = NSTemporaryDirectory() + "capgate-console-\(UUID().uuidString)"
            defer { try? FileManager.default.removeItem(atPath: downloads) }
            let (status, output) = try await SDKTests.run(
                python, [SDKTests.root.appendingPathComponent("Tests/console/console_browser_check.py").path],
                environment: [
                    "CAPGATE_URL": h.gatewayURL, "ADMIN_KEY": aUsers[0].key, "MEMBER_KEY": aUsers[1].key,
                    "OPERATOR_TOKEN": h.operatorToken, "COMPANY_A": a.text, "COMPANY_B": b.text, "COMPANY_NO_PLAN": noPlan.text,
                    "COMPANY_FULL": full.text, "COMPANY_UNLIMITED": unlimited.text, "SCREENSHOTS": folder,
                    "DOWNLOADS": downloads,
                ])
            #expect(status == 0, "\(output)")
            #expect(output.contains("console ok"), "\(output)")
        }
    }
}
