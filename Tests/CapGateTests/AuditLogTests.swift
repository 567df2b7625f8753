import Foundation
import NIOHTTP1
import Testing

@testable import CapGate

/// SPEC §13: every change through the admin or operator API writes one audit row in its own
/// transaction (a change that fails writes none), never with a secret; the reads page newest
/// first, filter by action, and keep a company's log to its admins and the operator.
@Suite("Audit log", .timeLimit(.minutes(5)))
struct AuditLogTests {
    static func auditCount(_ h: Harness, _ action: String) async throws -> Int64 {
        try await h.scalar("SELECT count(*) FROM audit_log WHERE action = '\(action)'")
    }

    @Test("each change writes one row with actor, company, target, before, after and request id; a failing one writes none")
    func rowsPerChange() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 10)
            let plan = try await h.op(.PUT, "/admin/v1/plans/p", .obj(["name": "Pro", "monthly_company_cap": 200]))
            #expect(plan.status == 200)
            let requestID = plan.headers.first(name: "request-id")
            let row = try #require(try await h.text("SELECT to_jsonb(a) FROM audit_log a WHERE action = 'plan.update'"))
            let json = try JSON.parse(Array(row.utf8))
            #expect(json["actor"]?.stringValue == "operator")
            #expect(json["company_id"]?.isNull == true)
            #expect(json["target_id"]?.stringValue == "p")
            #expect(json["request_id"]?.stringValue == requestID)
            #expect(json["before"]?["monthly_company_cap"]?.intValue == 100)
            #expect(json["after"]?["monthly_company_cap"]?.intValue == 200)
            #expect(json["after"]?["name"]?.stringValue == "Pro")

            let (company, users) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            #expect(try await Self.auditCount(h, "plan.create") == 1)
            #expect(try await Self.auditCount(h, "company.create") == 1)
            #expect(try await Self.auditCount(h, "user.create") == 1)
            #expect(try await Self.auditCount(h, "api_key.create") == 1)
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM audit_log WHERE company_id = '\(company.text)' AND target_id = '\(users[0].id.text)'") == 1)

            // Failing changes write nothing: a duplicate plan, a duplicate user, an unknown plan to assign.
            let before = try await h.scalar("SELECT count(*) FROM audit_log")
            #expect(try await h.op(.POST, "/admin/v1/plans", .obj(["id": "p", "name": "Again"])).status == 409)
            let duplicate = try await h.op(
                .POST, "/admin/v1/companies/\(company.text)/users", .obj(["id": .string(users[0].id.text), "role": "member"]))
            #expect(duplicate.status == 409)
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(company.text)/plan", .obj(["plan": "nope"])).status == 404)
            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/nope", .obj(["enabled": true])).status == 404)
            #expect(try await h.scalar("SELECT count(*) FROM audit_log") == before)

            // The other writes: one row each.
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(company.text)", .obj(["name": "Renamed"])).status == 200)
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(company.text)/plan", .obj(["plan": "p"])).status == 200)
            #expect(
                try await h.op(.PATCH, "/admin/v1/companies/\(company.text)/users/\(users[0].id.text)", .obj(["monthly_cap": 5]))
                    .status == 200)
            #expect(try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "app.p", "plan_id": "p"])).status == 201)
            #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "chat", "name": "Chat"])).status == 201)
            #expect(try await h.op(.PUT, "/admin/v1/features/chat", .obj(["name": "Chat 2"])).status == 200)
            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/chat", .obj(["daily_limit": 5])).status == 201)
            #expect(try await h.op(.DELETE, "/admin/v1/plans/p/entitlements/chat").status == 200)
            #expect(try await h.op(.POST, "/admin/v1/routes", .obj(["id": "r1", "path": "/v1/x", "units": 2])).status == 201)
            #expect(try await h.op(.PUT, "/admin/v1/routes/r1", .obj(["units": 3])).status == 200)
            #expect(try await h.op(.DELETE, "/admin/v1/routes/r1").status == 200)
            #expect(try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([])])).status == 200)
            for action in [
                "company.update", "company.assign_plan", "user.update", "product.create", "feature.create", "feature.update",
                "entitlement.put", "entitlement.delete", "route.create", "route.update", "route.delete", "price_book.replace",
            ] {
                #expect(try await Self.auditCount(h, action) == 1, "\(action)")
            }
            #expect(try await h.text("SELECT after->>'monthly_cap' FROM audit_log WHERE action = 'user.update'") == "5")
            #expect(try await h.text("SELECT before->>'units' FROM audit_log WHERE action = 'route.delete'") == "3")
            #expect(try await h.scalar("SELECT count(*) FROM audit_log WHERE action = 'route.delete' AND after IS NULL") == 1)
            #expect(try await h.scalar("SELECT count(*) FROM audit_log WHERE request_id IS NULL OR request_id = ''") == 0)
        }
    }

    @Test("no audit row holds a key, a key hash or a token")
    func noSecrets() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let keys = try await h.op(.GET, "/admin/v1/companies/\(company.text)/api-keys")
            let keyID = try #require(keys.json["data"]?.arrayValue?.first?["id"]?.stringValue)
            let rotated = try await h.op(.POST, "/admin/v1/companies/\(company.text)/api-keys/\(keyID)/rotate", .obj([:]))
            #expect(rotated.status == 201)
            let newKey = try #require(rotated.json["key"]?.stringValue)
            #expect(try await h.op(.DELETE, "/admin/v1/companies/\(company.text)/api-keys/\(keyID)").status == 200)
            let all = try #require(try await h.text("SELECT string_agg(to_jsonb(a)::text, ' ') FROM audit_log a"))
            for secret in [users[0].key, newKey, h.operatorToken] { #expect(!all.contains(secret)) }
            #expect(!all.contains("key_hash"))
            #expect(try await h.scalar("SELECT count(*) FROM audit_log WHERE action IN ('api_key.rotate', 'api_key.revoke')") == 2)
            #expect(
                try await h.text("SELECT after->'new'->>'id' FROM audit_log WHERE action = 'api_key.rotate'")
                    == rotated.json["id"]?.stringValue)
        }
    }

    @Test("reads: newest first, paged by cursor, filtered by action; a company's admin reads its own only, another's gets 403")
    func reads() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (a, adminsA) = try await h.createCompany(plan: "p", users: 3, role: "admin")
            let (b, adminsB) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            let adminA = [("x-api-key", adminsA[0].key)]
            // company.create, 3 × (user.create, api_key.create) for A.
            let first = try await h.request(.GET, "/admin/v1/companies/\(a.text)/audit?limit=4", headers: adminA)
            #expect(first.status == 200)
            let page1 = try #require(first.json["data"]?.arrayValue)
            #expect(page1.count == 4)
            #expect(first.json["has_more"]?.boolValue == true)
            let ids = page1.compactMap { $0["id"]?.intValue }
            #expect(ids == ids.sorted(by: >))
            // SPEC §13's fields: time, actor, company, action, target id, before, after, request id.
            for row in page1 {
                #expect(row["time"]?.stringValue.flatMap(Timestamp.parseStrict) != nil, "\(row.serialized())")
                for field in ["actor", "company_id", "action", "target_id", "before", "after", "request_id"] {
                    #expect(row[field] != nil, "\(field)")
                }
            }
            let cursor = try #require(first.json["next_cursor"]?.stringValue)
            let second = try await h.request(.GET, "/admin/v1/companies/\(a.text)/audit?limit=4&cursor=\(cursor)", headers: adminA)
            let page2 = try #require(second.json["data"]?.arrayValue)
            #expect(page2.count == 3)
            #expect(second.json["has_more"]?.boolValue == false)
            #expect(second.json["next_cursor"]?.isNull == true)
            #expect(page2.last?["action"]?.stringValue == "company.create")
            #expect(Set((page1 + page2).compactMap { $0["company_id"]?.stringValue }) == [a.text])

            let keysOnly = try await h.request(.GET, "/admin/v1/companies/\(a.text)/audit?action=api_key.create", headers: adminA)
            #expect(keysOnly.json["data"]?.arrayValue?.count == 3)
            #expect(
                try await h.request(.GET, "/admin/v1/companies/\(a.text)/audit?action=DROP%20TABLE", headers: adminA).status == 400)

            // Another company's admin, a member, and the whole log: 403, learning nothing.
            let other = try await h.request(.GET, "/admin/v1/companies/\(b.text)/audit", headers: adminA)
            let missing = try await h.request(.GET, "/admin/v1/companies/\(UUID().text)/audit", headers: adminA)
            #expect(other.status == 403)
            #expect(missing.status == 403)
            #expect(other.json["error"]?["message"] == missing.json["error"]?["message"])
            let member = [("x-api-key", adminsA[1].key)]
            try await h.exec("UPDATE users SET role = 'member' WHERE id = '\(adminsA[1].id.text)'")
            #expect(try await h.request(.GET, "/admin/v1/companies/\(a.text)/audit", headers: member).status == 403)
            #expect(try await h.request(.GET, "/admin/v1/audit", headers: adminA).status == 403)
            #expect(try await h.request(.GET, "/admin/v1/audit", headers: [("x-api-key", adminsB[0].key)]).status == 403)

            // The operator reads both companies' and the plans'.
            let everything = try await h.op(.GET, "/admin/v1/audit?limit=500")
            #expect(everything.status == 200)
            let companies = Set(everything.json["data"]?.arrayValue?.compactMap { $0["company_id"]?.stringValue } ?? [])
            #expect(companies == [a.text, b.text])
            #expect(everything.json["data"]?.arrayValue?.last?["action"]?.stringValue == "plan.create")
            #expect(try await h.op(.GET, "/admin/v1/companies/\(b.text)/audit").json["data"]?.arrayValue?.count == 3)
        }
    }

    @Test("operator.tokens: each named token acts as the operator and the audit names it; operator.token stays 'operator'")
    func namedOperatorTokens() async throws {
        let ci = "ci-token-" + UUID().uuidString
        let deploy = "deploy-token-" + UUID().uuidString
        let tokens = "ci:\(ci),deploy:\(deploy)"  // SPEC §7's form
        try await Harness.with(settings: ["operator.tokens": tokens]) { h in
            for (token, plan, status) in [(ci, "a", 201), (deploy, "b", 201), (h.operatorToken, "c", 201), (ci + "x", "d", 401)] {
                let reply = try await h.request(
                    .POST, "/admin/v1/plans", headers: [("authorization", "Bearer " + token)],
                    json: .obj(["id": .string(plan), "name": .string(plan)]))
                #expect(reply.status == status, "\(plan)")
            }
            #expect(
                try await h.text("SELECT string_agg(target_id || '=' || actor, ',' ORDER BY id) FROM audit_log")
                    == "a=ci,b=deploy,c=operator")
        }
    }
}
