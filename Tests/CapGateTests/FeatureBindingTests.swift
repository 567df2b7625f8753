import Foundation
import JWTKit
import Testing

@testable import CapGate

/// Claims of a token bound to features at `app.capgate.features` (a string, a list, or a
/// number to prove a claim the gateway cannot read is refused).
struct BoundClaims: JWTPayload {
    enum Features: Codable {
        case one(String), many([String]), number(Int)

        init(from decoder: any Decoder) throws {
            let c = try decoder.singleValueContainer()
            if let s = try? c.decode(String.self) {
                self = .one(s)
            } else if let a = try? c.decode([String].self) {
                self = .many(a)
            } else {
                self = .number(try c.decode(Int.self))
            }
        }

        func encode(to encoder: any Encoder) throws {
            var c = encoder.singleValueContainer()
            switch self {
            case .one(let s): try c.encode(s)
            case .many(let a): try c.encode(a)
            case .number(let n): try c.encode(n)
            }
        }
    }

    var sub: String
    var exp: Int
    var company_id: String
    var app: [String: [String: Features]]?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// SPEC §8 "Who picks the feature": `header_features` on routes, API keys bound with
/// `features`, tokens bound by `jwt.featureClaim`. A refused call is charged nothing and
/// reaches nothing; at the end of each test the provider served exactly the calls charged.
@Suite("Who picks the feature: bound credentials and header_features", .timeLimit(.minutes(5)))
struct FeatureBindingTests {
    /// `analysis` (a member may use 2 a day) and `chat` (unlimited) in plan `p`; /v1/messages
    /// charges analysis and takes CapGate-Feature.
    static func seed(_ h: Harness) async throws {
        try await h.createPlan("p", company: 100, user: 100)
        try await FeatureAdmissionTests.seed(h, plan: "p", userDaily: 2)
        try await h.exec("INSERT INTO plan_features (plan_id, feature_id) VALUES ('p', 'chat')")
    }

    static func servedEqualsCharged(_ h: Harness) async throws {
        let charged = try await h.eventually(
            "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'", equals: Int64(h.mock.counter.count))
        #expect(charged == Int64(h.mock.counter.count))
    }

    @Test(
        "the issue's exploit: a member at the analysis day limit names chat on a key bound to analysis: 403, nothing charged; an unbound key is served as before; keys show their features"
    )
    func boundKey() async throws {
        try await Harness.with { h in
            try await Self.seed(h)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let c = company.text
            let member = users[0]
            let unbound = member.key
            let keys = "/admin/v1/companies/\(c)/api-keys"
            let created = try await h.op(.POST, keys, .obj(["user_id": .string(member.id.text), "features": .array(["analysis"])]))
            #expect(created.status == 201)
            #expect(created.json["features"] == .array(["analysis"]))
            let bound = try #require(created.json["key"]?.stringValue)
            // Bad bindings: 400 naming the id, or the shape.
            let unknown = try await h.op(
                .POST, keys, .obj(["user_id": .string(member.id.text), "features": .array(["analysis", "nope"])]))
            #expect(unknown.status == 400)
            #expect(unknown.json["error"]?["message"]?.stringValue?.contains("'nope'") == true)
            #expect(try await h.op(.POST, keys, .obj(["user_id": .string(member.id.text), "features": "analysis"])).status == 400)
            #expect(try await h.op(.POST, keys, .obj(["user_id": .string(member.id.text), "features": .array([1])])).status == 400)
            let listed = try await h.op(.GET, keys)
            let items = listed.json["data"]?.arrayValue ?? []
            #expect(items.count == 2)
            #expect(items.contains { $0["features"] == .null })
            #expect(items.contains { $0["features"] == .array(["analysis"]) })

            func charged() async throws -> Int64 {
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged'")
            }
            // The member uses the analysis day limit on the bound key.
            #expect(try await h.message(key: bound).status == 200)
            #expect(try await h.message(key: bound).status == 200)
            let limited = try await h.message(key: bound)
            #expect(limited.status == 402)
            #expect(limited.json["error"]?["type"]?.stringValue == "feature_limit_exceeded")
            // The exploit: name chat instead. Bound: 403, nothing charged or forwarded.
            let (ledger, served) = (try await charged(), h.mock.counter.count)
            let used = try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'")
            let exploit = try await h.message(key: bound, headers: [("CapGate-Feature", "chat")])
            #expect(exploit.status == 403)
            #expect(exploit.json["error"]?["type"]?.stringValue == "permission_error")
            // The same with an Idempotency-Key (its own admission function): 403, the key not kept.
            let idempotent = try await h.message(key: bound, headers: [("CapGate-Feature", "chat"), ("Idempotency-Key", "k1")])
            #expect(idempotent.status == 403)
            #expect(try await h.scalar("SELECT count(*) FROM idempotency_keys WHERE company_id = '\(c)'") == 0)
            // An unknown header feature is 400 before the binding's 403.
            #expect(try await h.message(key: bound, headers: [("CapGate-Feature", "nope")]).status == 400)
            #expect(try await charged() == ledger)
            #expect(h.mock.counter.count == served)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == used)
            #expect(try await h.scalar("SELECT count(*) FROM user_feature_usage WHERE feature_id = 'chat'") == 0)
            // The dry run says the same: a bound key may not be charged to chat; the unbound may.
            func check(_ key: String, _ feature: String) async throws -> JSON {
                try await h.request(.GET, "/v1/usage/check?feature=\(feature)", headers: [("x-api-key", key)]).json
            }
            let dryRun = try await check(bound, "chat")
            #expect(dryRun["allowed"] == .bool(false) && dryRun["reason"] == .string("permission_error"))
            #expect(try await check(bound, "analysis")["reason"] == .string("feature_limit_exceeded"))
            #expect(try await check(unbound, "chat")["allowed"] == .bool(true))

            // A call whose route names no feature is allowed on a bound key and counts against the caps.
            let echo = try await h.request(.POST, "/v1/echo", headers: [("x-api-key", bound)], json: .obj([:]))
            #expect(echo.status == 200)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == used + 1)

            // Unbound (as before, docs/threat-model.md): the header picks chat, and it is served.
            #expect(try await h.message(key: unbound, headers: [("CapGate-Feature", "chat")]).status == 200)
            #expect(try await h.scalar("SELECT used FROM company_feature_usage WHERE feature_id = 'chat' AND span = 'day'") == 1)

            // A binding change applies to the next call (the admission reads it; nothing is cached).
            try await h.exec("UPDATE api_keys SET features = ARRAY['analysis', 'chat'] WHERE features IS NOT NULL")
            #expect(try await h.message(key: bound, headers: [("CapGate-Feature", "chat")]).status == 200)
            try await h.exec("UPDATE api_keys SET features = '{}' WHERE features IS NOT NULL")
            #expect(try await h.message(key: bound, headers: [("CapGate-Feature", "chat")]).status == 403)
            try await Self.servedEqualsCharged(h)
        }
    }

    @Test("header_features: the header may name only the listed features (another is 400); route objects show them")
    func headerFeatures() async throws {
        try await Harness.with { h in
            try await Self.seed(h)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            let bad = try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["header_features": .array(["analysis", "nope"])]))
            #expect(bad.status == 400)
            #expect(bad.json["error"]?["message"]?.stringValue?.contains("'nope'") == true)
            #expect(try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["header_features": .array([])])).status == 400)
            let put = try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["header_features": .array(["analysis"])]))
            #expect(put.status == 200)
            #expect(put.json["header_features"] == .array(["analysis"]))
            #expect(put.json["feature_header"] == .bool(true))
            let models = try await h.op(.GET, "/admin/v1/routes/models")
            #expect(models.json["header_features"] == .null)
            let created = try await h.op(
                .POST, "/admin/v1/routes",
                .obj([
                    "id": "chat", "method": "POST", "path": "/v1/chat", "feature": "chat", "feature_header": true,
                    "header_features": .array(["chat", "analysis", "chat"]),
                ]))
            #expect(created.status == 201)
            #expect(created.json["header_features"] == .array(["chat", "analysis"]))

            let served = h.mock.counter.count
            let unlisted = try await h.message(key: key, headers: [("CapGate-Feature", "chat")])
            #expect(unlisted.status == 400)
            #expect(unlisted.json["error"]?["type"]?.stringValue == "invalid_request_error")
            #expect(h.mock.counter.count == served)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "analysis")]).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE feature = 'chat'") == 0)
            // null lifts the restriction again, for the next call (the refusal above was read off
            // the gateway's copy of the table, which is checked against the database's version).
            #expect(try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["header_features": .null])).status == 200)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "chat")]).status == 200)
            // The same for a route refused and then allowed again.
            #expect(try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["allowed": false])).status == 200)
            #expect(try await h.message(key: key).status == 403)
            #expect(try await h.op(.PUT, "/admin/v1/routes/messages", .obj(["allowed": true])).status == 200)
            #expect(try await h.message(key: key).status == 200)
            try await Self.servedEqualsCharged(h)
        }
    }

    @Test(
        "a token bound at jwt.featureClaim (nested path; a string or a list) is charged only to those features; another is 403, nothing charged; no claim: as before; an unreadable claim is 401"
    )
    func boundToken() async throws {
        let settings = ["jwt.secret": JWTTests.secret, "jwt.featureClaim": "app.capgate.features"]
        try await Harness.with(settings: settings) { h in
            try await Self.seed(h)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let c = company.text
            func token(_ features: BoundClaims.Features?) async throws -> [(String, String)] {
                let keys = JWTKeyCollection()
                await keys.add(hmac: HMACKey(from: JWTTests.secret), digestAlgorithm: .sha256)
                let claims = BoundClaims(
                    sub: users[0].id.text, exp: JWTTests.inAnHour, company_id: c, app: features.map { ["capgate": ["features": $0]] })
                return [("authorization", "Bearer \(try await keys.sign(claims))")]
            }
            func call(_ auth: [(String, String)], feature: String? = nil, path: String = "/v1/messages") async throws -> Int {
                try await h.request(
                    .POST, path, headers: auth + (feature.map { [("CapGate-Feature", $0)] } ?? []),
                    json: .obj(["model": "m", "max_tokens": 5])
                ).status
            }
            func ledger() async throws -> Int64 {
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged'")
            }
            let analysis = try await token(.one("analysis"))
            #expect(try await call(analysis) == 200)
            let (before, served) = (try await ledger(), h.mock.counter.count)
            #expect(try await call(analysis, feature: "chat") == 403)
            #expect(try await call(analysis, feature: "nope") == 400)
            let chatOnly = try await token(.many(["chat"]))
            #expect(try await call(chatOnly) == 403)  // the route itself names analysis
            #expect(try await ledger() == before)
            #expect(h.mock.counter.count == served)
            // A route with no feature: allowed, and counted against the caps.
            let used = try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'")
            #expect(try await call(chatOnly, path: "/v1/echo") == 200)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == used + 1)
            // A list naming both: either may be picked.
            let both = try await token(.many(["analysis", "chat"]))
            #expect(try await call(both, feature: "chat") == 200)
            #expect(try await call(chatOnly, feature: "chat") == 200)
            // No claim: unbound, as before.
            #expect(try await call(try await token(nil), feature: "chat") == 200)
            // A claim the gateway cannot read does not leave the token unbound.
            #expect(try await call(try await token(.number(5)), feature: "chat") == 401)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE feature = 'chat'") == 3)
            try await Self.servedEqualsCharged(h)
        }
    }

    @Test("the batched and the single admission decide a bound key's calls alike")
    func batchMatchesSingle() async throws {
        try await Harness.with { h in
            try await Self.seed(h)
            try await BatchAdmissionTests.withMetering(h) { _, database in
                var decisions: [[String]] = []
                for batched in [true, false] {
                    let (company, users) = try await h.createCompany(plan: "p", users: 1)
                    let reply = try await h.op(
                        .POST, "/admin/v1/companies/\(company.text)/api-keys",
                        .obj(["user_id": .string(users[0].id.text), "features": .array(["analysis"])]))
                    let bound = try #require(reply.json["key"]?.stringValue)
                    let calls = [("analysis", bound), ("chat", bound), ("chat", users[0].key), (nil, bound), ("nope", bound)].map {
                        feature, key in
                        AdmissionItem(
                            keyHash: ApiKeyGenerator.hash(key),
                            request: AdmissionRequest(
                                companyID: .zero, userID: .zero, method: "POST", route: "/v1/messages", feature: feature,
                                requestID: "req_" + UUID().uuidString))
                    }
                    var results: [Result<AdmissionRow, any Error>] = []
                    if batched {
                        results = await MeteringStore.admitBatch(calls, database: database, relaxed: false)
                    } else {
                        for call in calls {
                            do {
                                let rows = try await MeteringStore.runAdmitOne(call, database: database, relaxed: false, spool: nil)
                                results.append(.success(rows[0]))
                            } catch {
                                results.append(.failure(error))
                            }
                        }
                    }
                    decisions.append(BatchAdmissionTests.decisions(results))
                }
                #expect(decisions[0] == ["charged", "feature_not_bound", "charged", "charged", "unknown_feature"])
                #expect(decisions[1] == decisions[0])
            }
        }
    }
}
