import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import CapGate

/// Three companies, their plans, users, keys and ledger in memory (``InMemoryTenants``), served
/// by the gateway's real router (``GatewayRouterTests/router(flags:stores:)``) with the in-memory
/// stores: the read routes through `app.test(.router)`, no database, no socket.
///
/// Acme (plan `pro`: 1,000 units, 100 a user, features `search` 50 and `draft` unlimited) has an
/// admin, a member capped at 5 and a disabled member; Globex (plan `free`: 10 units, its zone
/// Asia/Tokyo) an admin; Idle no plan. The ledger, by id: 1–2 Acme's past period; 3 Globex
/// (9 units); 4–8 Acme's current period (a refund at 6, an unsettled charge at 7, a pending one at 8).
struct StoreWorld {
    static let secret = CredentialRouteTests.secret
    var tenants = InMemoryTenants()
    /// The audit log, by id: 1 a plan (no company), 2 Acme created, 3 its member added, 4 a key
    /// made and 6 revoked by its admin; 5 Globex created, 7 its admin changed.
    var audit = InMemoryAudit()
    /// Threshold notifications (``NotificationRouteTests``): Acme's four, Globex's one.
    var notifications = InMemoryNotifications()
    /// A whole second, so a time written in a query names a row's time exactly.
    let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
    let acme: UUID
    let globex: UUID
    let idle: UUID
    let acmeAdmin: UUID
    let acmeMember: UUID
    let acmeDisabled: UUID
    let globexAdmin: UUID
    /// API keys: the member's, a revoked and an expired one of the member, the disabled user's.
    let keys: (member: String, revoked: String, expired: String, disabled: String)
    /// Acme's current and past period, and Globex's (all from `now`).
    var current: (start: Date, end: Date) { (now - 10 * day, now + 20 * day) }
    var past: (start: Date, end: Date) { (now - 40 * day, now - 10 * day) }
    let day: TimeInterval = 86_400

    init() {
        var t = InMemoryTenants()
        let now = self.now
        let day = self.day
        t.addPlan("pro", name: "Pro", companyCap: 1_000, userCap: 100, features: ["search": 50, "draft": nil])
        t.addPlan("free", name: "Free", companyCap: 10)
        acme = t.addCompany("Acme", createdAt: now - 100 * day, appAccountToken: UUID())
        globex = t.addCompany("Globex", createdAt: now - 90 * day, timeZone: "Asia/Tokyo")
        idle = t.addCompany("Idle", createdAt: now - 80 * day)
        t.addPeriod(company: acme, plan: "pro", start: now - 40 * day, end: now - 10 * day)
        t.addPeriod(company: acme, plan: "pro", start: now - 10 * day, end: now + 20 * day)
        t.addPeriod(company: globex, plan: "free", start: now - 10 * day, end: now + 20 * day)
        acmeAdmin = t.addUser(company: acme, role: .admin, email: "ada@acme.test", createdAt: now - 99 * day)
        acmeMember = t.addUser(company: acme, role: .member, email: "max@acme.test", cap: 5, createdAt: now - 98 * day)
        acmeDisabled = t.addUser(company: acme, role: .member, disabled: true, createdAt: now - 97 * day)
        globexAdmin = t.addUser(company: globex, role: .admin, createdAt: now - 89 * day)
        keys = (ApiKeyGenerator.make().key, ApiKeyGenerator.make().key, ApiKeyGenerator.make().key, ApiKeyGenerator.make().key)
        t.addKey(company: acme, user: acmeMember, secret: keys.member, features: ["search"])
        t.addKey(company: acme, user: acmeMember, secret: keys.revoked, revokedAt: now - day)
        t.addKey(company: acme, user: acmeMember, secret: keys.expired, expiresAt: now - 60)
        t.addKey(company: acme, user: acmeDisabled, secret: keys.disabled)
        Self.ledger(&t, now: now, ids: (acme, globex, acmeAdmin, acmeMember, globexAdmin))
        tenants = t
        let admin = acmeAdmin.lowercased
        audit.add(action: "plan.create", company: nil, at: now - 100 * day, target: "pro", after: .obj(["id": "pro"]))
        audit.add(action: "company.create", company: acme, at: now - 100 * day, target: acme.lowercased)
        audit.add(action: "user.create", company: acme, at: now - 98 * day, target: acmeMember.lowercased)
        audit.add(action: "api_key.create", company: acme, actor: admin, at: now - 50 * day)
        audit.add(action: "company.create", company: globex, at: now - 90 * day, target: globex.lowercased)
        audit.add(
            action: "api_key.revoke", company: acme, actor: admin, at: now - day, before: .obj(["revoked_at": .null]),
            after: .obj(["revoked_at": "2026-11-28T00:00:00Z"]))
        audit.add(action: "user.update", company: globex, at: now - 2 * day, target: globexAdmin.lowercased)
        notifications = NotificationRouteTests.rows(self)
    }

    /// The ledger of the suite's comment, by id.
    static func ledger(_ t: inout InMemoryTenants, now: Date, ids: (UUID, UUID, UUID, UUID, UUID)) {
        let (acme, globex, admin, member, globexAdmin) = ids
        let day: TimeInterval = 86_400
        t.addCall(company: acme, user: admin, at: now - 35 * day, units: 1, cost: Micros(100))
        t.addCall(company: acme, user: member, at: now - 30 * day, units: 6, feature: "search", cost: Micros(600))
        t.addCall(company: globex, user: globexAdmin, at: now - 5 * day, units: 9, cost: Micros(900))
        t.addCall(
            company: acme, user: member, at: now - 5 * day, units: 2, feature: "search", tokens: (100, 20), cost: Micros(3_000))
        t.addCall(company: acme, user: member, at: now - 4 * day, units: 3, model: "claude-haiku-4-5", cost: Micros(1_000))
        t.addCall(company: acme, user: member, at: now - 3 * day, units: 1, refunded: true)
        t.addCall(company: acme, user: admin, at: now - 2 * day, units: 1, hold: Micros(700))
        t.addCall(company: acme, user: admin, at: now - 60, units: 4, hold: Micros(500))
    }

    /// The gateway's router over these tenants (JWTs signed with ``secret`` accepted).
    func app() async throws -> some ApplicationProtocol {
        let usage = InMemoryUsage(tenants)
        let stores = GatewayStores(
            usage: usage, daily: usage, companies: usage, credentials: InMemoryCredentials(tenants), audit: audit,
            notifications: notifications)
        return Application(router: try await GatewayRouterTests.router(flags: ["jwt.secret": Self.secret], stores: stores))
    }

    /// A bearer JWT for `user` of `company`, valid for an hour.
    func token(_ user: UUID, of company: UUID) -> HTTPFields {
        let claims = #"{"sub":"\#(user.lowercased)","company_id":"\#(company.lowercased)","exp":\#(CredentialRouteTests.later)}"#
        return [.authorization: "Bearer \(CredentialRouteTests.jwt(claims))"]
    }

    var admin: HTTPFields { token(acmeAdmin, of: acme) }
    var member: HTTPFields { token(acmeMember, of: acme) }
    var otherAdmin: HTTPFields { token(globexAdmin, of: globex) }
    var operatorToken: HTTPFields { [.authorization: "Bearer \(GatewayRouterTests.operatorToken)"] }

    /// `GET uri` with `headers`: its status and its body read as JSON (nil when it is not).
    static func get(_ client: some TestClientProtocol, _ uri: String, _ headers: HTTPFields) async throws -> (HTTPResponse.Status, JSON?) {
        let response = try await client.execute(uri: uri, method: .get, headers: headers)
        return (response.status, try? JSONParser.parse(response.body))
    }

    /// The SPEC's error envelope: `{"type": "error", "error": {"type", "message"}}`; the error's type and message.
    static func error(_ json: JSON?) -> (type: String?, message: String?) {
        #expect(json?["type"]?.stringValue == "error", "not the error envelope: \(String(describing: json))")
        return (json?["error"]?["type"]?.stringValue, json?["error"]?["message"]?.stringValue)
    }

    /// `YYYY-MM-DD` of `date` in `zone`.
    static func day(_ date: Date, zone: String = "UTC") -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: zone)!
        let c = calendar.dateComponents([.year, .month, .day], from: date)
        return String(format: "%04d-%02d-%02d", c.year!, c.month!, c.day!)
    }
}
