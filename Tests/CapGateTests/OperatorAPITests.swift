import CapGate
import Foundation
import NIOHTTP1
import Testing

@Suite("Operator API", .timeLimit(.minutes(5)))
struct OperatorAPITests {
    @Test("plans: create, read, list, update; validation, 404, duplicate 409; a new default replaces the old one")
    func plans() async throws {
        try await Harness.with { h in
            let created = try await h.op(
                .POST, "/admin/v1/plans",
                .obj([
                    "id": "low", "name": "Low Use", "monthly_company_cap": 100, "monthly_user_cap": 25, "price": 9.99,
                    "currency": "USD", "is_default": true, "is_active": true, "sort_order": 1,
                ])
            )
            #expect(created.status == 201)
            #expect(created.json["id"]?.stringValue == "low")
            #expect(created.json["monthly_company_cap"]?.intValue == 100)
            #expect(created.json["price"]?.doubleValue == 9.99)
            #expect(created.json["is_default"]?.boolValue == true)
            let unlimited = try await h.op(
                .POST, "/admin/v1/plans", .obj(["id": "high", "name": "High", "monthly_company_cap": .null, "monthly_user_cap": .null]))
            #expect(unlimited.status == 201)
            #expect(unlimited.json["monthly_company_cap"]?.isNull == true)
            #expect(try await h.op(.GET, "/admin/v1/plans/low").json["name"]?.stringValue == "Low Use")
            #expect(try await h.op(.GET, "/admin/v1/plans").json["data"]?.arrayValue?.count == 2)
            #expect(try await h.op(.GET, "/admin/v1/plans/nope").status == 404)

            let duplicate = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "low", "name": "Again"]))
            #expect(duplicate.status == 409)
            // One default at most: making a plan the default (create or update) unsets the old one.
            let secondDefault = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "other", "name": "Other", "is_default": true]))
            #expect(secondDefault.status == 201)
            #expect(secondDefault.json["is_default"]?.boolValue == true)
            #expect(try await h.op(.GET, "/admin/v1/plans/low").json["is_default"]?.boolValue == false)
            let moved = try await h.op(.PUT, "/admin/v1/plans/high", .obj(["name": "High", "is_default": true]))
            #expect(moved.status == 200)
            #expect(moved.json["is_default"]?.boolValue == true)
            #expect(try await h.op(.GET, "/admin/v1/plans/other").json["is_default"]?.boolValue == false)
            #expect(try await h.scalar("SELECT count(*) FROM plans WHERE is_default") == 1)

            for bad: JSON in [
                .obj(["name": "No id"]), .obj(["id": "Bad Id!", "name": "x"]), .obj(["id": "x", "name": "x", "monthly_company_cap": -1]),
                .obj(["id": "x", "name": "x", "monthly_user_cap": "ten"]), .obj(["id": "x", "name": "x", "is_active": "yes"]),
                .obj(["id": "x", "name": "x", "monthly_user_cap": 1_000_000_000_000_001]), .obj(["id": "x", "name": "x\u{0}"]),
                .obj(["id": "x", "name": "x", "monthly_user_cap": 2.5]), .array([]),
            ] {
                let reply = try await h.op(.POST, "/admin/v1/plans", bad)
                #expect(reply.status == 400, "\(bad.serialized()) → \(reply.body)")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
            }
            let notJSON = try await h.request(
                .POST, "/admin/v1/plans", headers: h.asOperator + [("content-type", "application/json")], body: "{nope")
            #expect(notJSON.status == 400)

            // A whole number written with a fraction is a whole number; a NUL in a field CapGate
            // does not read changes nothing.
            let updated = try await h.op(
                .PUT, "/admin/v1/plans/low",
                .obj(["monthly_company_cap": .double(200.0), "name": "Low Use 2", "note": .array([.string("a\u{0}b")])]))
            #expect(updated.status == 200, "\(updated.body)")
            #expect(updated.json["monthly_company_cap"]?.intValue == 200)
            #expect(updated.json["monthly_user_cap"]?.intValue == 25)
            #expect(try await h.op(.PUT, "/admin/v1/plans/nope", .obj(["name": "x"])).status == 404)
        }
    }

    @Test("products map store ids to plans; unknown plan 404, duplicate 409, bad interval 400")
    func products() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let created = try await h.op(
                .POST, "/admin/v1/products", .obj(["product_id": "skininsight.low.monthly", "plan_id": "low", "interval": "month"]))
            #expect(created.status == 201)
            #expect(created.json["product_id"]?.stringValue == "skininsight.low.monthly")
            #expect(try await h.op(.GET, "/admin/v1/products").json["data"]?.arrayValue?.count == 1)
            #expect(
                try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "p2", "plan_id": "nope", "interval": "month"])).status
                    == 404)
            #expect(
                try await h.op(
                    .POST, "/admin/v1/products", .obj(["product_id": "skininsight.low.monthly", "plan_id": "low", "interval": "month"])
                ).status == 409)
            #expect(
                try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "p3", "plan_id": "low", "interval": "week"])).status == 400)
        }
    }

    @Test(
        "a user id is unique within its company: the same id in two companies is two users (no answer tells one company of the other's), a repeat within one is 409"
    )
    func userIDsPerCompany() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (a, _) = try await h.createCompany(plan: "low", users: 0)
            let (b, _) = try await h.createCompany(plan: "low", users: 0)
            let person = UUID().text
            // B adds the person first; A can still add the same identity-provider id.
            for (company, email) in [(b, "p@b.test"), (a, "p@a.test")] {
                let created = try await h.op(
                    .POST, "/admin/v1/companies/\(company.text)/users", .obj(["id": .string(person), "email": .string(email)]))
                #expect(created.status == 201, "\(created.body)")
                #expect(created.json["company_id"]?.stringValue == company.text)
            }
            let again = try await h.op(.POST, "/admin/v1/companies/\(a.text)/users", .obj(["id": .string(person)]))
            #expect(again.status == 409)
            // Each company sees its own user, and its calls are charged to it alone.
            for (company, email) in [(a, "p@a.test"), (b, "p@b.test")] {
                let users = try await h.op(.GET, "/admin/v1/companies/\(company.text)/users")
                let listed = users.json["data"]?.arrayValue ?? users.json.arrayValue ?? []
                #expect(listed.filter { $0["id"]?.stringValue == person }.map { $0["email"]?.stringValue } == [email], "\(users.body)")
                let key = try await h.op(.POST, "/admin/v1/companies/\(company.text)/api-keys", .obj(["user_id": .string(person)]))
                #expect(key.status == 201)
                #expect(try await h.message(key: key.json["key"]?.stringValue ?? "").status == 200)
            }
            #expect(try await h.scalar("SELECT count(*) FROM users WHERE id = '\(person)'") == 2)
            for company in [a, b] {
                #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
                #expect(
                    try await h.scalar("SELECT used FROM user_usage WHERE company_id = '\(company.text)' AND user_id = '\(person)'") == 1)
            }
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("companies, users, keys and plan assignment")
    func companiesUsersKeys() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            try await h.createPlan("medium", company: 500, user: 100, sort: 2)
            let company = try await h.op(.POST, "/admin/v1/companies", .obj(["name": "Acme", "plan": "low"]))
            #expect(company.status == 201)
            let id = company.json["id"]!.stringValue!
            #expect(company.json["plan"]?.stringValue == "low")
            #expect(company.json["auto_renew"]?.boolValue == true)
            #expect(company.json["period"]?["start"]?.stringValue != nil)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(id)").json["name"]?.stringValue == "Acme")
            #expect(try await h.op(.GET, "/admin/v1/companies/\(UUID().text)").status == 404)
            #expect(try await h.op(.GET, "/admin/v1/companies/not-a-uuid").status == 404)
            #expect(try await h.op(.POST, "/admin/v1/companies", .obj(["name": "X", "plan": "nope"])).status == 404)
            #expect(try await h.op(.POST, "/admin/v1/companies", .obj(["plan": "low"])).status == 400)
            #expect(try await h.op(.POST, "/admin/v1/companies", .obj(["id": .string(id), "name": "Dup"])).status == 409)

            let user = try await h.op(
                .POST, "/admin/v1/companies/\(id)/users", .obj(["email": "a@acme.test", "role": "admin", "monthly_cap": 5]))
            #expect(user.status == 201)
            let userID = user.json["id"]!.stringValue!
            #expect(user.json["company_id"]?.stringValue == id)
            #expect(user.json["monthly_cap"]?.intValue == 5)
            #expect(user.json["disabled"]?.boolValue == false)
            #expect(try await h.op(.POST, "/admin/v1/companies/\(id)/users", .obj(["role": "boss"])).status == 400)
            #expect(try await h.op(.POST, "/admin/v1/companies/\(UUID().text)/users", .obj(["role": "member"])).status == 404)
            let patched = try await h.op(
                .PATCH, "/admin/v1/companies/\(id)/users/\(userID)", .obj(["monthly_cap": .null, "role": "member"]))
            #expect(patched.status == 200)
            #expect(patched.json["monthly_cap"]?.isNull == true)
            #expect(patched.json["role"]?.stringValue == "member")
            #expect(patched.json["email"]?.stringValue == "a@acme.test")
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(id)/users/\(UUID().text)", .obj(["disabled": true])).status == 404)

            let key = try await h.op(.POST, "/admin/v1/companies/\(id)/api-keys", .obj(["user_id": .string(userID)]))
            #expect(key.status == 201)
            let secret = key.json["key"]!.stringValue!
            #expect(secret.count >= 40)
            #expect(secret.hasPrefix(key.json["prefix"]!.stringValue!))
            #expect(key.json["revoked_at"]?.isNull == true)
            // Only the SHA-256 is stored.
            #expect(try await h.scalar("SELECT count(*) FROM api_keys WHERE key_hash = sha256('\(secret)'::bytea)") == 1)
            #expect(
                try await h.scalar(
                    "SELECT count(*) FROM api_keys WHERE encode(key_hash, 'escape') LIKE '%\(secret.dropFirst(3).prefix(20))%'") == 0)
            #expect(try await h.op(.POST, "/admin/v1/companies/\(id)/api-keys", .obj(["user_id": .string(UUID().text)])).status == 404)
            #expect(try await h.op(.DELETE, "/admin/v1/companies/\(id)/api-keys/\(UUID().text)").status == 404)

            // A disabled user's key stops working.
            #expect(try await h.request(.GET, "/v1/usage", headers: [("x-api-key", secret)]).status == 200)
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(id)/users/\(userID)", .obj(["disabled": true])).status == 200)
            #expect(try await h.request(.GET, "/v1/usage", headers: [("x-api-key", secret)]).status == 401)

            let moved = try await h.op(.PUT, "/admin/v1/companies/\(id)/plan", .obj(["plan": "medium", "auto_renew": false]))
            #expect(moved.status == 200)
            #expect(moved.json["plan"]?.stringValue == "medium")
            #expect(moved.json["auto_renew"]?.boolValue == false)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(id)'") == 2)
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(id)/plan", .obj(["plan": "nope"])).status == 404)
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(id)/plan", .obj(["plan": "low", "started_at": "yesterday"])).status == 400)
        }
    }

    @Test("a known path asked with another method is 405 with Allow; an unknown path is 404; nothing is forwarded")
    func methodNotAllowed() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let cases: [(HTTPMethod, String, String)] = [
                (.DELETE, "/admin/v1/plans/low", "GET, PUT"), (.POST, "/healthz", "GET"),
                (.DELETE, "/admin/v1/companies/\(company.text)", "GET, PATCH"), (.POST, "/v1/usage", "GET"),
                (.PUT, "/v1/usage/check", "GET"),
            ]
            for (method, path, allow) in cases {
                let reply = try await h.request(method, path, headers: [("x-api-key", users[0].key)] + h.asOperator)
                #expect(reply.status == 405, "\(method) \(path) → \(reply.status)")
                #expect(reply.headers.first(name: "allow") == allow)
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
            }
            #expect(try await h.op(.GET, "/admin/v1/nothing").status == 404)
            #expect(try await h.op(.DELETE, "/admin/v1/nothing/here").status == 404)
            #expect(h.mock.counter.count == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
        }
    }

    @Test("operator routes refuse company credentials and missing credentials")
    func operatorOnly() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            let admin = [("x-api-key", users[0].key)]
            #expect(try await h.request(.GET, "/admin/v1/plans", headers: admin).status == 403)
            #expect(try await h.request(.POST, "/admin/v1/plans", headers: admin, json: .obj(["id": "x", "name": "x"])).status == 403)
            // A company's own users and keys are its admins' too (SPEC §13); its plan and name are not.
            #expect(
                try await h.request(.PUT, "/admin/v1/companies/\(company.text)/plan", headers: admin, json: .obj(["plan": "low"])).status
                    == 403)
            #expect(
                try await h.request(.PATCH, "/admin/v1/companies/\(company.text)", headers: admin, json: .obj(["name": "x"])).status == 403)
            #expect(try await h.request(.GET, "/admin/v1/plans").status == 401)
            #expect(try await h.request(.GET, "/admin/v1/plans", headers: [("authorization", "Bearer wrong-token")]).status == 401)
        }
    }

    @Test(
        "a plan's price is exact: 19.99 in is 19.99 stored and out (never 19.989999…), through create, read, list and an update that leaves it out"
    )
    func priceIsExact() async throws {
        try await Harness.with { h in
            let created = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "p", "name": "P", "price": 19.99]))
            #expect(created.status == 201)
            #expect(created.body.contains("\"price\":19.99"), "\(created.body)")
            #expect(try await h.text("SELECT price FROM plans WHERE id = 'p'") == "19.99")
            #expect(try await h.op(.GET, "/admin/v1/plans/p").body.contains("\"price\":19.99"))
            #expect(try await h.op(.GET, "/admin/v1/plans").json["data"]?.arrayValue?.first?["price"]?.doubleValue == 19.99)
            // An update without a price keeps it exactly.
            let renamed = try await h.op(.PUT, "/admin/v1/plans/p", .obj(["name": "Renamed"]))
            #expect(renamed.status == 200)
            #expect(renamed.body.contains("\"price\":19.99"), "\(renamed.body)")
            #expect(try await h.text("SELECT price FROM plans WHERE id = 'p'") == "19.99")
            // Numbers keep their shortest form, as before: 49, 49.5, 0.1; a numeric string is read too.
            for (sent, shown, stored) in [
                (JSON.int(49), "49", "49.00"), (.double(49.5), "49.5", "49.50"), (.string("0.1"), "0.1", "0.10"),
                (.string("+.05"), "0.05", "0.05"), (.double(9_999_999_999.99), "9999999999.99", "9999999999.99"),
                (.int(0), "0", "0.00"),
            ] {
                let reply = try await h.op(.PUT, "/admin/v1/plans/p", .obj(["price": sent]))
                #expect(reply.status == 200, "\(sent): \(reply.body)")
                #expect(reply.body.contains("\"price\":\(shown),") || reply.body.contains("\"price\":\(shown)}"), "\(sent): \(reply.body)")
                #expect(try await h.text("SELECT price FROM plans WHERE id = 'p'") == stored)
            }
        }
    }

    @Test(
        "a price that numeric(14,2) cannot hold exactly is 400 and changes nothing: more than 2 decimals, negative, too large, an exponent")
    func inexactPriceRefused() async throws {
        try await Harness.with { h in
            #expect(try await h.op(.POST, "/admin/v1/plans", .obj(["id": "p", "name": "P", "price": "12.34"])).status == 201)
            let bad: [JSON] = [
                .double(9.999), .double(19.995), .double(-1), .int(-1), .double(-0.01), .int(10_000_000_000), .double(1e16),
                .string("1e2"), .string("12.345"), .string("-3"), .string(""), .string("."), .string("1,5"), .string(" 12"), .bool(true),
            ]
            for price in bad {
                let create = try await h.op(.POST, "/admin/v1/plans", .obj(["id": "q", "name": "Q", "price": price]))
                #expect(create.status == 400, "\(price): \(create.body)")
                #expect(create.json["error"]?["message"]?.stringValue?.contains("'price'") == true)
                let update = try await h.op(.PUT, "/admin/v1/plans/p", .obj(["price": price]))
                #expect(update.status == 400, "\(price): \(update.body)")
            }
            #expect(try await h.scalar("SELECT count(*) FROM plans WHERE id = 'q'") == 0)
            #expect(try await h.text("SELECT price FROM plans WHERE id = 'p'") == "12.34")
        }
    }
}
