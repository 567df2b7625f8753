import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /admin/v1/companies/{id}/audit` and `GET /admin/v1/audit` (SPEC §13), through the
/// gateway's router with the in-memory audit log of ``StoreWorld``.
@Suite("Audit routes with in-memory stores", .timeLimit(.minutes(1)))
struct AuditRouteTests {
    let world = StoreWorld()

    var audit: String { "/admin/v1/companies/\(world.acme.lowercased)/audit" }

    static func ids(_ json: JSON?) -> [Int64] { json?["data"]?.arrayValue?.compactMap { $0["id"]?.intValue } ?? [] }

    @Test("a company's admin reads its company's rows, newest first, with every field")
    func companyRows() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, audit, world.admin)
            #expect(status == .ok && Self.ids(json) == [6, 4, 3, 2])
            #expect(json?["has_more"]?.boolValue == false && json?["next_cursor"]?.isNull == true)
            let revoke = try #require(json?["data"]?.arrayValue?.first)
            #expect(revoke["action"]?.stringValue == "api_key.revoke" && revoke["actor"]?.stringValue == world.acmeAdmin.lowercased)
            #expect(revoke["company_id"]?.stringValue == world.acme.lowercased && revoke["request_id"]?.stringValue == "req_audit_6")
            #expect(revoke["before"]?["revoked_at"]?.isNull == true)
            #expect(revoke["after"]?["revoked_at"]?.stringValue == "2026-11-28T00:00:00Z")
            #expect(revoke["time"]?.stringValue == Timestamp.format(world.now - world.day) && revoke["target_id"]?.isNull == true)
        }
    }

    @Test("action= keeps one action's rows; a name that is not an action is 400")
    func actionFilter() async throws {
        try await world.app().test(.router) { client in
            #expect(Self.ids(try await StoreWorld.get(client, audit + "?action=company.create", world.admin).1) == [2])
            #expect(Self.ids(try await StoreWorld.get(client, audit + "?action=plan.update", world.admin).1).isEmpty)
            for bad in ["Company.create", "company", "company.create.x", "a.b1"] {
                let (status, json) = try await StoreWorld.get(client, audit + "?action=\(bad)", world.admin)
                #expect(status == .badRequest, "\(bad)")
                #expect(StoreWorld.error(json).message == "'action' must be an action name such as user.create or api_key.revoke.")
            }
        }
    }

    @Test("pages: limit and the previous page's next_cursor walk back to the oldest row; an exact page has no more")
    func pages() async throws {
        try await world.app().test(.router) { client in
            let first = try await StoreWorld.get(client, audit + "?limit=2", world.admin).1
            #expect(Self.ids(first) == [6, 4] && first?["has_more"]?.boolValue == true && first?["next_cursor"]?.stringValue == "4")
            let second = try await StoreWorld.get(client, audit + "?limit=2&cursor=4", world.admin).1
            #expect(Self.ids(second) == [3, 2] && second?["has_more"]?.boolValue == false && second?["next_cursor"]?.isNull == true)
            let exact = try await StoreWorld.get(client, audit + "?limit=4", world.admin).1
            #expect(Self.ids(exact).count == 4 && exact?["has_more"]?.boolValue == false)
        }
    }

    @Test("a cursor that no page gave and a limit outside 1…500 are 400 invalid_request_error")
    func badQuery() async throws {
        try await world.app().test(.router) { client in
            let cursor = "'cursor' must be a cursor from a previous page."
            let limit = "'limit' must be a whole number from 1 to 500."
            let cases = [
                ("cursor=0", cursor), ("cursor=04", cursor), ("cursor=-4", cursor), ("cursor=x", cursor),
                ("cursor=1234567890123456789", cursor), ("limit=0", limit), ("limit=501", limit),
            ]
            for (query, message) in cases {
                let (status, json) = try await StoreWorld.get(client, audit + "?" + query, world.admin)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(query)")
                #expect(error.message == message, "\(query)")
            }
        }
    }

    @Test("another company's admin and a member are 403; an unknown company is 404 for the operator")
    func companyRefused() async throws {
        try await world.app().test(.router) { client in
            let other = try await StoreWorld.get(client, audit, world.otherAdmin)
            #expect(other.0 == .forbidden && StoreWorld.error(other.1).type == "permission_error")
            #expect(try await StoreWorld.get(client, audit, world.member).0 == .forbidden)
            let unknown = try await StoreWorld.get(client, "/admin/v1/companies/\(UUID().lowercased)/audit", world.operatorToken)
            #expect(unknown.0 == .notFound)
            let globex = try await StoreWorld.get(client, "/admin/v1/companies/\(world.globex.lowercased)/audit", world.otherAdmin)
            #expect(Self.ids(globex.1) == [7, 5])
        }
    }

    @Test("the whole gateway's log is the operator's: every row, a company's admin 403")
    func gatewayLog() async throws {
        try await world.app().test(.router) { client in
            let all = try await StoreWorld.get(client, "/admin/v1/audit", world.operatorToken)
            #expect(all.0 == .ok && Self.ids(all.1) == [7, 6, 5, 4, 3, 2, 1])
            #expect(all.1?["data"]?.arrayValue?.last?["company_id"]?.isNull == true)
            let plans = try await StoreWorld.get(client, "/admin/v1/audit?action=plan.create", world.operatorToken).1
            #expect(Self.ids(plans) == [1])
            let admin = try await StoreWorld.get(client, "/admin/v1/audit", world.admin)
            #expect(admin.0 == .forbidden && StoreWorld.error(admin.1).message == "Only the operator may do this.")
        }
    }
}
