import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /v1/usage` (SPEC §4) and the credentials in front of it (SPEC §2), through the gateway's
/// router with in-memory stores (``StoreWorld``): who may read, and what the caller sees.
@Suite("GET /v1/usage with in-memory stores", .timeLimit(.minutes(1)))
struct CallerUsageRouteTests {
    let world = StoreWorld()

    @Test("a member's token: its company's and its own units of the current period against its caps")
    func memberReads() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/v1/usage", world.member)
            #expect(status == .ok)
            #expect(json?["company_id"]?.stringValue == world.acme.lowercased)
            #expect(json?["user_id"]?.stringValue == world.acmeMember.lowercased)
            #expect(json?["scope"]?.stringValue == "user")
            #expect(json?["plan"]?["id"]?.stringValue == "pro" && json?["plan"]?["name"]?.stringValue == "Pro")
            // 2 + 3 + 1 + 4: the refund (ledger row 6) is not counted, nor the past period's rows.
            #expect(json?["company"]?["used"]?.intValue == 10)
            #expect(json?["company"]?["limit"]?.intValue == 1_000 && json?["company"]?["remaining"]?.intValue == 990)
            // The member's own cap (5) overrides the plan's per-user 100.
            #expect(json?["user"]?["used"]?.intValue == 5)
            #expect(json?["user"]?["limit"]?.intValue == 5 && json?["user"]?["remaining"]?.intValue == 0)
            #expect(json?["period"]?["start"]?.stringValue == Timestamp.format(world.current.start))
        }
    }

    @Test("an admin's read is its own: the plan's per-user cap, its own units")
    func adminReadsItsOwn() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/v1/usage", world.admin)
            #expect(status == .ok)
            #expect(json?["user"]?["used"]?.intValue == 5 && json?["user"]?["limit"]?.intValue == 100)
            #expect(json?["company"]?["used"]?.intValue == 10)
        }
    }

    @Test("another company's user sees only its company: Globex's 9 of 10")
    func otherCompany() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/v1/usage", world.otherAdmin)
            #expect(status == .ok)
            #expect(json?["company_id"]?.stringValue == world.globex.lowercased)
            #expect(json?["company"]?["used"]?.intValue == 9 && json?["company"]?["remaining"]?.intValue == 1)
            #expect(json?["user"]?["limit"]?.isNull == true)
        }
    }

    @Test("the RateLimit fields follow the counters: company and user remaining")
    func rateLimitFields() async throws {
        try await world.app().test(.router) { client in
            let response = try await client.execute(uri: "/v1/usage", method: .get, headers: world.member)
            let state = try #require(response.headers[.rateLimit])
            #expect(state.contains("\"company\";r=990;"))
            #expect(state.contains("\"user\";r=0;"))
            #expect(response.headers[.rateLimitPolicy]?.contains("\"company\";q=1000;w=2592000") == true)
        }
    }

    @Test("the company's purchase token is shown to its members; a company without one shows null")
    func appAccountToken() async throws {
        try await world.app().test(.router) { client in
            let acme = try await StoreWorld.get(client, "/v1/usage", world.member).1
            let token = try #require(world.tenants.company(world.acme)?.appAccountToken)
            #expect(acme?["app_account_token"]?.stringValue == token.lowercased)
            let globex = try await StoreWorld.get(client, "/v1/usage", world.otherAdmin).1
            #expect(globex?["app_account_token"]?.isNull == true)
        }
    }

    @Test("a company without a plan: plan and period null, nothing used, no RateLimit fields")
    func noPlan() async throws {
        var changed = self.world
        let user = changed.tenants.addUser(company: changed.idle, role: .member, createdAt: changed.now)
        let world = changed
        try await world.app().test(.router) { client in
            let response = try await client.execute(uri: "/v1/usage", method: .get, headers: world.token(user, of: world.idle))
            let json = try? JSONParser.parse(response.body)
            #expect(response.status == .ok)
            #expect(json?["plan"]?.isNull == true && json?["period"]?.isNull == true)
            #expect(json?["company"]?["used"]?.intValue == 0 && json?["company"]?["limit"]?.isNull == true)
            #expect(response.headers[.rateLimit] == nil)
        }
    }

    @Test("an API key in x-api-key or as a bearer reads as its user")
    func apiKey() async throws {
        try await world.app().test(.router) { client in
            for headers: HTTPFields in [[.xAPIKey: world.keys.member], [.authorization: "Bearer \(world.keys.member)"]] {
                let (status, json) = try await StoreWorld.get(client, "/v1/usage", headers)
                #expect(status == .ok)
                #expect(json?["user_id"]?.stringValue == world.acmeMember.lowercased)
            }
        }
    }

    @Test("a revoked, an expired, an unknown key and a disabled user's key are 401 saying which")
    func refusedKeys() async throws {
        try await world.app().test(.router) { client in
            let cases: [(String, String)] = [
                (world.keys.revoked, "This API key was revoked. Ask your administrator for a new one."),
                (world.keys.expired, "This API key has expired. Ask your administrator for a new one."),
                (ApiKeyGenerator.make().key, "Unknown API key. Check the key, or ask your administrator for a new one."),
                (world.keys.disabled, "This user is disabled. Ask your administrator to enable it."),
            ]
            for (key, message) in cases {
                let (status, json) = try await StoreWorld.get(client, "/v1/usage", [.xAPIKey: key])
                let error = StoreWorld.error(json)
                #expect(status == .unauthorized && error.type == "authentication_error")
                #expect(error.message == message)
            }
        }
    }

    @Test("a well-signed token of a user its company does not have, or of a disabled user, is 401")
    func unknownTokenUser() async throws {
        try await world.app().test(.router) { client in
            // Globex's admin named as Acme's: the pair is what must exist.
            let (status, json) = try await StoreWorld.get(client, "/v1/usage", world.token(world.globexAdmin, of: world.acme))
            #expect(status == .unauthorized)
            #expect(StoreWorld.error(json).message?.hasPrefix("The token's user is not known in its company") == true)
            let disabled = try await StoreWorld.get(client, "/v1/usage", world.token(world.acmeDisabled, of: world.acme))
            #expect(disabled.0 == .unauthorized)
            #expect(StoreWorld.error(disabled.1).message == "This user is disabled. Ask your administrator to enable it.")
        }
    }

    @Test("the operator token has no usage of its own: 403 permission_error")
    func operatorRefused() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/v1/usage", world.operatorToken)
            #expect(status == .forbidden && StoreWorld.error(json).type == "permission_error")
        }
    }

    @Test("GET /admin/v1/me names the credential: a member's role and ids, the operator's role")
    func me() async throws {
        try await world.app().test(.router) { client in
            let member = try await StoreWorld.get(client, "/admin/v1/me", world.member).1
            #expect(member?["role"]?.stringValue == "member" && member?["company_id"]?.stringValue == world.acme.lowercased)
            #expect(member?["user_id"]?.stringValue == world.acmeMember.lowercased)
            let admin = try await StoreWorld.get(client, "/admin/v1/me", [.xAPIKey: world.keys.member]).1
            #expect(admin?["role"]?.stringValue == "member")
            let op = try await StoreWorld.get(client, "/admin/v1/me", world.operatorToken).1
            #expect(op?["role"]?.stringValue == "operator" && op?["company_id"]?.isNull == true)
        }
    }
}
