import Foundation
import NIOHTTP1
import Testing

@testable import CapGate

/// SPEC §13's API keys: a name, an expiry (401 saying so, on every path that reads a key), a
/// rotation with a grace period, `last_used_at` written apart from the calls, and a company's
/// admins managing their own company's users and keys (another company's get 403).
@Suite("API key lifecycle", .timeLimit(.minutes(5)))
struct KeyLifecycleTests {
    static func expire(_ h: Harness, user: UUID) async throws {
        try await h.exec("UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE user_id = '\(user.text)'")
    }

    @Test("an expired key gets 401 saying it expired: proxy call, idempotent call, batched admission and admin read")
    func expiredKey() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            #expect(try await h.message(key: users[0].key).status == 200)
            try await Self.expire(h, user: users[0].id)
            let call = try await h.message(key: users[0].key)
            #expect(call.status == 401)
            #expect(call.json["error"]?["message"]?.stringValue?.contains("expired") == true)
            let idempotent = try await h.message(key: users[0].key, headers: [("idempotency-key", "one")])
            #expect(idempotent.status == 401)
            #expect(idempotent.json["error"]?["message"]?.stringValue?.contains("expired") == true)
            let admin = try await h.request(.GET, "/admin/v1/companies/\(company.text)/users", headers: [("x-api-key", users[0].key)])
            #expect(admin.status == 401)
            #expect(admin.json["error"]?["message"]?.stringValue?.contains("expired") == true)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 1)

            try await BatchAdmissionTests.withMetering(h) { _, database in
                let batch = [
                    BatchAdmissionTests.call(key: users[1].key), BatchAdmissionTests.call(key: users[0].key),
                    BatchAdmissionTests.call(key: users[1].key),
                ]
                let results = await MeteringStore.admitBatch(batch, database: database, relaxed: false)
                #expect(BatchAdmissionTests.decisions(results) == ["charged", "expired_key", "charged"])
                let single = await MeteringStore.admitBatch(
                    [BatchAdmissionTests.call(key: users[0].key)], database: database, relaxed: false)
                #expect(BatchAdmissionTests.decisions(single) == ["expired_key"])
            }
            // A key with an expiry still ahead works.
            try await h.exec(
                "UPDATE api_keys SET expires_at = now() + interval '1 hour' WHERE user_id = '\(users[1].id.text)'")
            #expect(try await h.message(key: users[1].key).status == 200)
        }
    }

    @Test(
        "the key rule's order, written once (capgate_key_check): revoked before expired before disabled, the same on the proxy, the idempotent call, a batch and a batch of one"
    )
    func keyRuleOrder() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (_, users) = try await h.createCompany(plan: "p", users: 4)
            let (revokedAndExpired, expiredAndDisabled, disabled, valid) = (users[0], users[1], users[2], users[3])
            try await h.exec("UPDATE api_keys SET revoked_at = now() WHERE user_id = '\(revokedAndExpired.id.text)'")
            for user in [revokedAndExpired, expiredAndDisabled] { try await Self.expire(h, user: user.id) }
            for user in [expiredAndDisabled, disabled] { try await h.exec("UPDATE users SET disabled = true WHERE id = '\(user.id.text)'") }
            let unknown = "cg_" + String(repeating: "x", count: 43)
            let keys = [revokedAndExpired.key, expiredAndDisabled.key, disabled.key, unknown, valid.key]
            let expected = ["revoked_key", "expired_key", "disabled_user", "unknown_key", "charged"]
            let words = ["revoked", "expired", "disabled", "Unknown API key"]

            // Through the gateway: the key check before the body, then the admission's own.
            for (index, key) in keys.enumerated() {
                let variants: [[(String, String)]] = [[], [("idempotency-key", "order-\(index)")]]
                for headers in variants {
                    let call = try await h.message(key: key, headers: headers)
                    if index < words.count {
                        #expect(call.status == 401, "\(expected[index]) \(headers)")
                        #expect(call.json["error"]?["message"]?.stringValue?.contains(words[index]) == true, "\(call.json)")
                    } else {
                        #expect(call.status == 200)
                    }
                }
            }
            // The admission functions themselves (the gateway's cache bypassed): the batch and
            // the single-call function answer the same.
            try await BatchAdmissionTests.withMetering(h) { _, database in
                let batch = await MeteringStore.admitBatch(
                    keys.map { BatchAdmissionTests.call(key: $0) }, database: database, relaxed: false)
                #expect(BatchAdmissionTests.decisions(batch) == expected)
                for (key, answer) in zip(keys, expected) {
                    let one = await MeteringStore.admitBatch([BatchAdmissionTests.call(key: key)], database: database, relaxed: false)
                    #expect(BatchAdmissionTests.decisions(one) == [answer], "\(answer)")
                }
            }
            // Charged: the valid key's two gateway calls, its batch call and its call alone.
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 4)
        }
    }

    @Test("create with name and expires_at; list shows every field and no secret; a key created with a past expires_at is 401 'expired'")
    func createAndList() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let path = "/admin/v1/companies/\(company.text)/api-keys"
            let created = try await h.op(
                .POST, path, .obj(["user_id": .string(users[0].id.text), "name": "ci", "expires_at": "2099-01-01T00:00:00Z"]))
            #expect(created.status == 201)
            #expect(created.json["name"]?.stringValue == "ci")
            #expect(created.json["expires_at"]?.stringValue == "2099-01-01T00:00:00Z")
            #expect(created.json["last_used_at"]?.isNull == true)
            let secret = try #require(created.json["key"]?.stringValue)
            let past = try await h.op(.POST, path, .obj(["user_id": .string(users[0].id.text), "expires_at": "2001-01-01T00:00:00Z"]))
            #expect(past.status == 201, "\(past.body)")
            let expired = try await h.message(key: try #require(past.json["key"]?.stringValue))
            #expect(expired.status == 401)
            #expect(expired.json["error"]?["message"]?.stringValue?.contains("expired") == true, "\(expired.body)")
            #expect(try await h.message(key: secret).status == 200)
            let list = try await h.op(.GET, path)
            #expect(!list.body.contains(secret))
            let keys = try #require(list.json["data"]?.arrayValue)
            #expect(keys.count == 3)
            for key in keys {
                for field in ["id", "name", "user_id", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at", "features"] {
                    #expect(key[field] != nil, "\(field)")
                }
                #expect(key["key"] == nil)
            }
        }
    }

    @Test("rotate: a new key with the same user, name, features and expiry; the old one works until the grace ends, then 401")
    func rotate() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            let path = "/admin/v1/companies/\(company.text)/api-keys"
            let created = try await h.op(
                .POST, path,
                .obj(["user_id": .string(users[0].id.text), "name": "deploy", "expires_at": "2099-01-01T00:00:00Z", "features": .array([])])
            )
            let oldKey = try #require(created.json["key"]?.stringValue)
            let oldID = try #require(created.json["id"]?.stringValue)
            // The company's admin rotates, with an hour's grace.
            let rotated = try await h.request(
                .POST, "\(path)/\(oldID)/rotate", headers: [("x-api-key", users[0].key)], json: .obj(["grace_seconds": 3600]))
            #expect(rotated.status == 201)
            let newKey = try #require(rotated.json["key"]?.stringValue)
            #expect(rotated.json["name"]?.stringValue == "deploy")
            #expect(rotated.json["user_id"]?.stringValue == users[0].id.text)
            #expect(rotated.json["expires_at"]?.stringValue == "2099-01-01T00:00:00Z")
            #expect(rotated.json["features"] == .array([]))
            #expect(rotated.json["id"]?.stringValue != oldID)
            let graceLeft = "SELECT extract(epoch FROM expires_at - now())::bigint FROM api_keys WHERE id = '\(oldID)'"
            #expect((3500...3600).contains(try await h.scalar(graceLeft)))
            #expect(try await h.message(key: oldKey).status == 200)
            #expect(try await h.message(key: newKey).status == 200)
            #expect(
                try await h.text("SELECT actor FROM audit_log WHERE action = 'api_key.rotate'") == users[0].id.text)
            // The grace ends (moved to a second ago rather than waited for): the old key is refused.
            try await h.exec("UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = '\(oldID)'")
            let late = try await h.message(key: oldKey)
            #expect(late.status == 401)
            #expect(late.json["error"]?["message"]?.stringValue?.contains("expired") == true)
            #expect(try await h.message(key: newKey).status == 200)
            // grace_seconds 0: the rotated key stops at once.
            let third = try await h.op(.POST, "\(path)/\(try #require(rotated.json["id"]?.stringValue))/rotate", .obj(["grace_seconds": 0]))
            #expect(third.status == 201)
            #expect(try await h.message(key: newKey).status == 401)
            #expect(try await h.message(key: try #require(third.json["key"]?.stringValue)).status == 200)
            // No body at all: the default grace of a day (SPEC §13's 86400).
            let thirdID = try #require(third.json["id"]?.stringValue)
            let bare = try await h.op(.POST, "\(path)/\(thirdID)/rotate")
            #expect(bare.status == 201, "\(bare.body)")
            let dayLeft = "SELECT extract(epoch FROM expires_at - now())::bigint FROM api_keys WHERE id = '\(thirdID)'"
            #expect((86300...86400).contains(try await h.scalar(dayLeft)))
            #expect(try await h.message(key: try #require(bare.json["key"]?.stringValue)).status == 200)
            // An expired or revoked key is not rotated again; an unknown one is 404.
            #expect(try await h.op(.POST, "\(path)/\(oldID)/rotate", .obj([:])).status == 409)
            #expect(try await h.op(.POST, "\(path)/\(UUID().text)/rotate", .obj([:])).status == 404)
            #expect(try await h.op(.POST, "\(path)/\(oldID)/rotate", .obj(["grace_seconds": -1])).status == 400)
        }
    }

    @Test("last_used_at: set after a call by the periodic flush, not rewritten within a minute")
    func lastUsed() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (_, users) = try await h.createCompany(plan: "p", users: 2)
            let key = "(SELECT id FROM api_keys WHERE user_id = '\(users[0].id.text)')"
            #expect(try await h.scalar("SELECT count(*) FROM api_keys WHERE last_used_at IS NOT NULL") == 0)
            #expect(try await h.message(key: users[0].key).status == 200)
            let set = try await h.eventually(
                "SELECT count(*) FROM api_keys WHERE id = \(key) AND last_used_at IS NOT NULL", equals: 1, within: .seconds(15))
            #expect(set == 1)
            let first = try await h.text("SELECT last_used_at FROM api_keys WHERE id = \(key)")
            #expect(try await h.message(key: users[0].key).status == 200)
            try await Task.sleep(for: .seconds(7))  // past the next flush (every 5 s)
            #expect(try await h.text("SELECT last_used_at FROM api_keys WHERE id = \(key)") == first)
            // Unused keys stay null.
            #expect(try await h.scalar("SELECT count(*) FROM api_keys WHERE user_id = '\(users[1].id.text)' AND last_used_at IS NULL") == 1)
            // A minute later the next use is written again.
            try await h.exec("UPDATE api_keys SET last_used_at = now() - interval '61 seconds' WHERE id = \(key)")
            #expect(try await h.message(key: users[0].key).status == 200)
            let rewritten = try await h.eventually(
                "SELECT count(*) FROM api_keys WHERE id = \(key) AND last_used_at > now() - interval '30 seconds'", equals: 1,
                within: .seconds(20))
            #expect(rewritten == 1)
        }
    }

    @Test("a company's admin manages its own users and keys; another company's admin and a member get 403")
    func adminsManageTheirOwn() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (a, usersA) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            let (b, usersB) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            let adminA = [("x-api-key", usersA[0].key)]
            let memberA = [("x-api-key", usersA[1].key)]
            let adminB = [("x-api-key", usersB[0].key)]

            let user = try await h.request(
                .POST, "/admin/v1/companies/\(a.text)/users", headers: adminA, json: .obj(["email": "new@example.com", "role": "member"]))
            #expect(user.status == 201)
            let userID = try #require(user.json["id"]?.stringValue)
            let patched = try await h.request(
                .PATCH, "/admin/v1/companies/\(a.text)/users/\(userID)", headers: adminA, json: .obj(["monthly_cap": 3, "role": "admin"]))
            #expect(patched.status == 200)
            let key = try await h.request(
                .POST, "/admin/v1/companies/\(a.text)/api-keys", headers: adminA,
                json: .obj(["user_id": .string(userID), "name": "laptop"]))
            #expect(key.status == 201)
            let keyID = try #require(key.json["id"]?.stringValue)
            #expect(try await h.request(.GET, "/admin/v1/companies/\(a.text)/api-keys", headers: adminA).status == 200)
            #expect(
                try await h.text("SELECT actor FROM audit_log WHERE action = 'api_key.create' AND target_id = '\(keyID)'")
                    == usersA[0].id.text)

            // Another company's admin: 403 on every route, and nothing changed.
            let attempts: [(HTTPMethod, String, JSON?)] = [
                (.GET, "/admin/v1/companies/\(a.text)/users", nil),
                (.POST, "/admin/v1/companies/\(a.text)/users", .obj(["role": "admin"])),
                (.PATCH, "/admin/v1/companies/\(a.text)/users/\(userID)", .obj(["disabled": true])),
                (.GET, "/admin/v1/companies/\(a.text)/api-keys", nil),
                (.POST, "/admin/v1/companies/\(a.text)/api-keys", .obj(["user_id": .string(userID)])),
                (.POST, "/admin/v1/companies/\(a.text)/api-keys/\(keyID)/rotate", .obj([:])),
                (.DELETE, "/admin/v1/companies/\(a.text)/api-keys/\(keyID)", nil),
                (.GET, "/admin/v1/companies/\(a.text)/audit", nil),
            ]
            for (method, path, body) in attempts {
                #expect(try await h.request(method, path, headers: adminB, json: body).status == 403, "\(path)")
                #expect(try await h.request(method, path, headers: memberA, json: body).status == 403, "\(path)")
            }
            // B's path with A's ids: 404, nothing of A's touched.
            #expect(try await h.request(.DELETE, "/admin/v1/companies/\(b.text)/api-keys/\(keyID)", headers: adminB).status == 404)
            #expect(
                try await h.request(
                    .PATCH, "/admin/v1/companies/\(b.text)/users/\(userID)", headers: adminB, json: .obj(["disabled": true])
                )
                .status == 404)
            #expect(try await h.scalar("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM users WHERE disabled") == 0)
            // Plans and companies stay the operator's.
            #expect(try await h.request(.POST, "/admin/v1/plans", headers: adminA, json: .obj(["id": "x", "name": "X"])).status == 403)
            #expect(
                try await h.request(.PUT, "/admin/v1/companies/\(a.text)/plan", headers: adminA, json: .obj(["plan": "p"])).status == 403)

            let revoked = try await h.request(.DELETE, "/admin/v1/companies/\(a.text)/api-keys/\(keyID)", headers: adminA)
            #expect(revoked.status == 200)
            #expect(try await h.message(key: try #require(key.json["key"]?.stringValue)).status == 401)
        }
    }
}
