import CapGate
import Foundation
import NIOHTTP1
import Testing

/// SPEC §8's operator routes and the company fields of §8 and §9, through the real server: every
/// change made here is what the next call is admitted by.
@Suite("Features, entitlements and routes: the operator API", .timeLimit(.minutes(5)))
struct FeatureOperatorTests {
    static func expect400(_ reply: Harness.Reply, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(reply.status == 400, "\(what) → \(reply.status) \(reply.body)", sourceLocation: sourceLocation)
        #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error", sourceLocation: sourceLocation)
    }

    @Test("features: create, read, list, update; validation 400, unknown 404, duplicate 409; members and admins 403")
    func features() async throws {
        try await Harness.with { h in
            let created = try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis", "sort_order": 2]))
            #expect(created.status == 201, "\(created.body)")
            #expect(created.json["id"]?.stringValue == "analysis")
            #expect(created.json["is_active"]?.boolValue == true)
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "chat", "name": "Chat", "sort_order": 1])).status == 201)
            let list = try await h.op(.GET, "/admin/v1/features").json["data"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
            #expect(list == ["chat", "analysis"])
            #expect(try await h.op(.GET, "/admin/v1/features/analysis").json["name"]?.stringValue == "Analysis")
            #expect(try await h.op(.GET, "/admin/v1/features/nope").status == 404)
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Again"])).status == 409)

            // PUT keeps what the body leaves out.
            let updated = try await h.op(.PUT, "/admin/v1/features/analysis", .obj(["is_active": false]))
            #expect(updated.status == 200, "\(updated.body)")
            #expect(updated.json["is_active"]?.boolValue == false)
            #expect(updated.json["name"]?.stringValue == "Analysis")
            #expect(updated.json["sort_order"]?.intValue == 2)
            #expect(try await h.op(.PUT, "/admin/v1/features/nope", .obj(["name": "x"])).status == 404)

            for bad: JSON in [
                .obj(["name": "No id"]), .obj(["id": "Bad Id", "name": "x"]), .obj(["id": "x"]), .obj(["id": "x", "name": ""]),
                .obj(["id": "x", "name": "x", "is_active": "yes"]), .obj(["id": "x", "name": "x", "sort_order": 1.5]),
                .obj(["id": "x", "name": "x\u{0}"]), .obj(["id": .string(String(repeating: "a", count: 65)), "name": "x"]), .array([]),
            ] {
                Self.expect400(try await h.op(.POST, "/admin/v1/features", bad), bad.serialized())
            }
            Self.expect400(try await h.op(.PUT, "/admin/v1/features/chat", .obj(["id": "other"])), "id mismatch")
            #expect(try await h.scalar("SELECT count(*) FROM features") == 2)

            try await h.createPlan("p", company: 10, user: 10)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let admin = try await h.createUser(company: company, role: "admin")
            for key in [users[0].key, admin.key] {
                let reply = try await h.request(.GET, "/admin/v1/features", headers: [("x-api-key", key)])
                #expect(reply.status == 403)
                let write = try await h.request(
                    .POST, "/admin/v1/routes", headers: [("x-api-key", key)],
                    json: .obj(["method": "GET", "path": "/v1/models*", "units": 0]))
                #expect(write.status == 403)
            }
            #expect(try await h.request(.GET, "/admin/v1/routes").status == 401)
            #expect(try await h.scalar("SELECT count(*) FROM routes") == 0)
        }
    }

    @Test("entitlements: PUT creates (201) then changes (200) keeping unnamed fields; DELETE removes; unknown plan or feature 404")
    func entitlements() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis"])).status == 201)
            let path = "/admin/v1/plans/low/entitlements/analysis"
            let created = try await h.op(.PUT, path, .obj(["daily_limit": 5, "user_period_limit": 50, "message": "Upgrade for more."]))
            #expect(created.status == 201, "\(created.body)")
            #expect(created.json["enabled"]?.boolValue == true)
            #expect(created.json["daily_limit"]?.intValue == 5)
            #expect(created.json["period_limit"]?.isNull == true)
            #expect(created.json["message"]?.stringValue == "Upgrade for more.")
            let changed = try await h.op(.PUT, path, .obj(["period_limit": 100, "daily_limit": .null]))
            #expect(changed.status == 200)
            #expect(changed.json["daily_limit"]?.isNull == true)
            #expect(changed.json["period_limit"]?.intValue == 100)
            #expect(changed.json["user_period_limit"]?.intValue == 50)
            #expect(changed.json["message"]?.stringValue == "Upgrade for more.")
            let listed = try await h.op(.GET, "/admin/v1/plans/low/entitlements")
            #expect(listed.json["data"]?.arrayValue?.count == 1)
            #expect(listed.json["data"]?.arrayValue?.first?["feature_id"]?.stringValue == "analysis")

            #expect(try await h.op(.PUT, "/admin/v1/plans/nope/entitlements/analysis", .obj(["enabled": true])).status == 404)
            #expect(try await h.op(.PUT, "/admin/v1/plans/low/entitlements/nope", .obj(["enabled": true])).status == 404)
            #expect(try await h.op(.GET, "/admin/v1/plans/nope/entitlements").status == 404)
            for bad: JSON in [
                .obj(["daily_limit": -1]), .obj(["period_limit": "ten"]), .obj(["enabled": "no"]), .obj(["user_daily_limit": 2.5]),
                .obj(["message": ""]), .obj(["feature_id": "chat"]), .obj(["daily_limit": 1_000_000_000_000_001]),
            ] {
                Self.expect400(try await h.op(.PUT, path, bad), bad.serialized())
            }
            #expect(try await h.scalar("SELECT period_limit FROM plan_features WHERE plan_id = 'low'") == 100)

            let removed = try await h.op(.DELETE, path)
            #expect(removed.status == 200)
            #expect(removed.json["feature_id"]?.stringValue == "analysis")
            #expect(try await h.op(.DELETE, path).status == 404)
            #expect(try await h.scalar("SELECT count(*) FROM plan_features") == 0)
        }
    }

    @Test("routes: create (id generated or given), read, replace, delete; bad method, path, units, feature 400; duplicates 409")
    func routes() async throws {
        try await Harness.with { h in
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis"])).status == 201)
            let models = try await h.op(.POST, "/admin/v1/routes", .obj(["method": "get", "path": "/v1/Models*", "units": 0]))
            #expect(models.status == 201, "\(models.body)")
            let modelsID = try #require(models.json["id"]?.stringValue)
            #expect(models.json["method"]?.stringValue == "GET")
            #expect(models.json["path"]?.stringValue == "/v1/models*")
            #expect(models.json["allowed"]?.boolValue == true)
            let messages = try await h.op(
                .POST, "/admin/v1/routes",
                .obj([
                    "id": "messages", "method": "POST", "path": "/v1/messages/", "units": 2, "feature": "analysis", "feature_header": true,
                ]))
            #expect(messages.status == 201, "\(messages.body)")
            #expect(messages.json["path"]?.stringValue == "/v1/messages")
            #expect(try await h.op(.GET, "/admin/v1/routes").json["data"]?.arrayValue?.count == 2)
            #expect(try await h.op(.GET, "/admin/v1/routes/\(modelsID)").json["units"]?.intValue == 0)
            #expect(try await h.op(.GET, "/admin/v1/routes/nope").status == 404)

            // Duplicates: the same id, or the same method and path however it is written.
            #expect(try await h.op(.POST, "/admin/v1/routes", .obj(["id": "messages", "method": "GET", "path": "/v1/x"])).status == 409)
            #expect(try await h.op(.POST, "/admin/v1/routes", .obj(["method": "GET", "path": "/v1/MODELS*"])).status == 409)

            for bad: JSON in [
                .obj(["method": "GET"]), .obj(["method": "GE T", "path": "/v1/x"]), .obj(["method": "GET", "path": "v1/x"]),
                .obj(["method": "GET", "path": "/v1/*/x"]), .obj(["method": "GET", "path": "/v1/../admin"]),
                .obj(["method": "GET", "path": "/v1/a//b"]), .obj(["method": "GET", "path": "/v1/x?y=1"]),
                .obj(["method": "GET", "path": "/v1/%6dodels"]), .obj(["method": "GET", "path": "/admin/v1/plans"]),
                .obj(["method": "GET", "path": "/v1/x", "units": -1]), .obj(["method": "GET", "path": "/v1/x", "units": 1_000_001]),
                .obj(["method": "GET", "path": "/v1/x", "units": "1"]), .obj(["method": "GET", "path": "/v1/x", "feature": "nope"]),
                .obj(["method": "GET", "path": "/v1/x", "allowed": "no"]), .obj(["id": "bad id", "method": "GET", "path": "/v1/x"]),
                .obj(["method": "GET", "path": "/v1/x", "items_field": ""]), .obj(["method": "GET", "path": "/v1/x y"]),
            ] {
                Self.expect400(try await h.op(.POST, "/admin/v1/routes", bad), bad.serialized())
            }
            #expect(try await h.scalar("SELECT count(*) FROM routes") == 2)

            let replaced = try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["units": 3, "allowed": false]))
            #expect(replaced.status == 200, "\(replaced.body)")
            #expect(replaced.json["units"]?.intValue == 3)
            #expect(replaced.json["feature"]?.stringValue == "analysis")
            #expect(replaced.json["allowed"]?.boolValue == false)
            let noFeature = try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["feature": .null]))
            #expect(noFeature.json["feature"]?.isNull == true)
            #expect(try await h.op(.PUT, "/admin/v1/routes/nope", .obj(["units": 1])).status == 404)
            Self.expect400(try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["path": "/v1/a/../b"])), "dot segment")

            #expect(try await h.op(.DELETE, "/admin/v1/routes/\(modelsID)").status == 200)
            #expect(try await h.op(.DELETE, "/admin/v1/routes/\(modelsID)").status == 404)
            #expect(try await h.scalar("SELECT count(*) FROM routes") == 1)
        }
    }

    @Test("changes through the operator API decide the next call: entitlement, feature off, route added, route forbidden")
    func changesDecideNextCall() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            try await h.createPlan("big", company: 1000, user: 1000, sort: 1)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            let c = company.text
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis"])).status == 201)
            #expect(
                try await h.op(
                    .POST, "/admin/v1/routes", .obj(["id": "messages", "method": "POST", "path": "/v1/messages", "feature": "analysis"])
                )
                .status == 201)
            // The feature is in no plan yet: refused, nothing charged.
            let notInPlan = try await h.message(key: key)
            #expect(notInPlan.status == 402)
            #expect(notInPlan.json["error"]?["type"]?.stringValue == "feature_not_in_plan")

            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/analysis", .obj(["daily_limit": 2])).status == 201)
            #expect(try await h.op(.PUT, "/admin/v1/plans/big/entitlements/analysis", .obj(["daily_limit": 20])).status == 201)
            #expect(try await h.message(key: key).status == 200)
            #expect(try await h.message(key: key).status == 200)
            let limited = try await h.message(key: key)
            #expect(limited.status == 402)
            #expect(limited.json["error"]?["type"]?.stringValue == "feature_limit_exceeded")
            #expect(limited.json["usage"]?["feature"]?["limit"]?.intValue == 2)
            #expect(limited.json["usage"]?["upgrade"]?["plan"]?.stringValue == "big")

            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/analysis", .obj(["daily_limit": 3])).status == 200)
            #expect(try await h.message(key: key).status == 200)
            #expect(try await h.op(.PUT, "/admin/v1/features/analysis", .obj(["is_active": false])).status == 200)
            // A feature the route names that is no longer active is out of every plan.
            #expect(try await h.message(key: key).json["error"]?["type"]?.stringValue == "feature_not_in_plan")
            #expect(try await h.op(.DELETE, "/admin/v1/routes/messages").status == 200)
            #expect(try await h.message(key: key).status == 200)  // no route: 1 unit, no feature

            #expect(try await h.op(.POST, "/admin/v1/routes", .obj(["method": "*", "path": "/v1/files*", "allowed": false])).status == 201)
            let forbidden = try await h.request(.GET, "/v1/files/abc", headers: [("x-api-key", key)])
            #expect(forbidden.status == 403)
            // Served equals charged: every call the provider answered is one ledger charge.
            #expect(h.mock.counter.count == 4)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == 4)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged'") == 4)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("companies: time_zone and webhook_url on create and PATCH; unknown zone, bad URL, plan fields 400; unknown company 404")
    func companyFields() async throws {
        try await Harness.with { h in
            let created = try await h.op(
                .POST, "/admin/v1/companies",
                .obj(["name": "Acme", "time_zone": "America/New_York", "webhook_url": "https://hooks.example.test/capgate"]))
            #expect(created.status == 201, "\(created.body)")
            #expect(created.json["time_zone"]?.stringValue == "America/New_York")
            #expect(created.json["webhook_url"]?.stringValue == "https://hooks.example.test/capgate")
            let id = try #require(created.json["id"]?.stringValue)
            let plain = try await h.op(.POST, "/admin/v1/companies", .obj(["name": "Plain"]))
            #expect(plain.json["time_zone"]?.stringValue == "UTC")
            #expect(plain.json["webhook_url"]?.isNull == true)

            let patched = try await h.op(.PATCH, "/admin/v1/companies/\(id)", .obj(["time_zone": "Europe/Berlin", "name": "Acme GmbH"]))
            #expect(patched.status == 200, "\(patched.body)")
            #expect(patched.json["time_zone"]?.stringValue == "Europe/Berlin")
            #expect(patched.json["name"]?.stringValue == "Acme GmbH")
            #expect(patched.json["webhook_url"]?.stringValue == "https://hooks.example.test/capgate")
            let cleared = try await h.op(.PATCH, "/admin/v1/companies/\(id)", .obj(["webhook_url": .null]))
            #expect(cleared.json["webhook_url"]?.isNull == true)
            #expect(cleared.json["time_zone"]?.stringValue == "Europe/Berlin")

            for bad: JSON in [
                .obj(["time_zone": "Mars/Olympus"]), .obj(["time_zone": .null]), .obj(["time_zone": "'; DROP TABLE companies; --"]),
                .obj(["webhook_url": "ftp://example.test/x"]), .obj(["webhook_url": "not a url"]), .obj(["webhook_url": "https://"]),
                .obj(["webhook_url": "https://user:secret@example.test/x"]), .obj(["webhook_url": 5]), .obj(["plan": "free"]),
                .obj(["auto_renew": false]), .obj(["name": ""]),
            ] {
                Self.expect400(try await h.op(.PATCH, "/admin/v1/companies/\(id)", bad), bad.serialized())
            }
            Self.expect400(
                try await h.op(.POST, "/admin/v1/companies", .obj(["name": "Bad", "time_zone": "Nowhere/Land"])), "create, bad zone")
            #expect(try await h.scalar("SELECT count(*) FROM companies") == 2)
            #expect(try await h.text("SELECT time_zone FROM companies WHERE id = '\(id)'") == "Europe/Berlin")
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(UUID().uuidString)", .obj(["name": "x"])).status == 404)

            // Only the operator changes a company: its own admin cannot point its webhooks elsewhere.
            let uuid = try #require(UUID(uuidString: id))
            let admin = try await h.createUser(company: uuid, role: "admin")
            let byAdmin = try await h.request(
                .PATCH, "/admin/v1/companies/\(id)", headers: [("x-api-key", admin.key)], json: .obj(["webhook_url": "http://127.0.0.1:1/"])
            )
            #expect(byAdmin.status == 403)
            #expect(try await h.text("SELECT webhook_url FROM companies WHERE id = '\(id)'") == nil)
        }
    }

    @Test("verify recomputes the feature counters from the ledger and names the window that disagrees")
    func verifyFeatures() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 2)
            try await FeatureAdmissionTests.seed(h, plan: "p", daily: 50)
            for user in users {
                #expect(try await h.message(key: user.key).status == 200)
            }
            let url = h.databaseURL
            #expect(try await CapGateRunner.verify(url: url, logger: TestCluster.logger).isEmpty)

            try await h.exec(
                "UPDATE user_feature_usage SET used = used + 1 WHERE company_id = '\(company.text)' AND user_id = '\(users[1].id)' AND span = 'day'"
            )
            let found = try await CapGateRunner.verify(url: url, logger: TestCluster.logger)
            #expect(found.count == 1)
            #expect(found.first?.feature == "analysis")
            #expect(found.first?.userID == users[1].id)
            #expect(found.first?.window?.hasPrefix("day ") == true)
            #expect(found.first?.counter == 2 && found.first?.ledger == 1)

            try await h.exec(
                """
                UPDATE user_feature_usage SET used = used - 1 WHERE company_id = '\(company.text)' AND span = 'day';
                UPDATE user_feature_usage SET used = used + 1 WHERE company_id = '\(company.text)' AND user_id = '\(users[0].id)' AND span = 'day';
                DELETE FROM company_feature_usage WHERE company_id = '\(company.text)' AND span = 'period'
                """)
            let moved = try await CapGateRunner.verify(url: url, logger: TestCluster.logger)
            #expect(
                moved.contains {
                    $0.feature == "analysis" && $0.userID == nil && $0.window?.hasPrefix("period ") == true && $0.counter == 0
                })
        }
    }
}
