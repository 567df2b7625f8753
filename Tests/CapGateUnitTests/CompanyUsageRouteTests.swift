import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /admin/v1/companies/{id}/usage` and `…/usage/history` (SPEC §4), through the gateway's
/// router with in-memory stores (``StoreWorld``): an admin reads its own company only, the
/// operator any, a member none; the fields the SPEC names; the query's bounds.
@Suite("Company usage routes with in-memory stores", .timeLimit(.minutes(1)))
struct CompanyUsageRouteTests {
    let world = StoreWorld()

    var usage: String { "/admin/v1/companies/\(world.acme.lowercased)/usage" }
    var history: String { "/admin/v1/companies/\(world.acme.lowercased)/usage/history" }

    @Test("an admin reads its company: the company object, its units and every user in creation order")
    func adminReads() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, usage, world.admin)
            #expect(status == .ok)
            #expect(json?["company"]?["id"]?.stringValue == world.acme.lowercased)
            #expect(json?["company"]?["name"]?.stringValue == "Acme" && json?["company"]?["plan"]?.stringValue == "pro")
            #expect(json?["company"]?["time_zone"]?.stringValue == "UTC")
            #expect(json?["usage"]?["scope"]?.stringValue == "company")
            #expect(json?["usage"]?["company"]?["used"]?.intValue == 10)
            #expect(json?["usage"]?["user"] == nil)
            let users = try #require(json?["users"]?.arrayValue)
            #expect(
                users.compactMap { $0["id"]?.stringValue } == [world.acmeAdmin, world.acmeMember, world.acmeDisabled].map(\.lowercased))
            #expect(users.map { $0["used"]?.intValue } == [5, 5, 0])
            #expect(users.map { $0["limit"]?.intValue } == [100, 5, 100])
            #expect(users.map { $0["remaining"]?.intValue } == [95, 0, 100])
            #expect(users.map { $0["email"]?.stringValue } == ["ada@acme.test", "max@acme.test", nil])
            #expect(users.map { $0["role"]?.stringValue } == ["admin", "member", "member"])
            #expect(users.map { $0["disabled"]?.boolValue } == [false, false, true])
        }
    }

    @Test("the operator reads any company; an unknown one is 404 not_found_error")
    func operatorReads() async throws {
        try await world.app().test(.router) { client in
            let globex = try await StoreWorld.get(client, "/admin/v1/companies/\(world.globex.lowercased)/usage", world.operatorToken)
            #expect(globex.0 == .ok && globex.1?["usage"]?["company"]?["used"]?.intValue == 9)
            let unknown = try await StoreWorld.get(client, "/admin/v1/companies/\(UUID().lowercased)/usage", world.operatorToken)
            #expect(unknown.0 == .notFound && StoreWorld.error(unknown.1).type == "not_found_error")
        }
    }

    @Test("another company's admin, and a member of the company, are 403 permission_error")
    func refused() async throws {
        try await world.app().test(.router) { client in
            for headers in [world.otherAdmin, world.member, [.xAPIKey: world.keys.member]] {
                for uri in [usage, history] {
                    let (status, json) = try await StoreWorld.get(client, uri, headers)
                    #expect(status == .forbidden, "\(uri)")
                    let error = StoreWorld.error(json)
                    #expect(error.type == "permission_error")
                    #expect(error.message == "You may only read your own company's data, as one of its admins.")
                }
            }
        }
    }

    @Test("an admin asking for a company that does not exist gets the same 403, revealing nothing")
    func unknownCompanyForAdmin() async throws {
        try await world.app().test(.router) { client in
            for uri in ["/admin/v1/companies/\(UUID().lowercased)/usage", "/admin/v1/companies/\(UUID().lowercased)/usage/history"] {
                let (status, _) = try await StoreWorld.get(client, uri, world.admin)
                #expect(status == .forbidden, "\(uri)")
            }
        }
    }

    @Test("a company id that is no UUID is 404; no credential is 401")
    func badIdAndNoCredential() async throws {
        try await world.app().test(.router) { client in
            let bad = try await StoreWorld.get(client, "/admin/v1/companies/acme/usage", world.operatorToken)
            #expect(bad.0 == .notFound && StoreWorld.error(bad.1).message == "No company with that id.")
            let none = try await StoreWorld.get(client, usage, [:])
            #expect(none.0 == .unauthorized && StoreWorld.error(none.1).type == "authentication_error")
        }
    }

    @Test("the history: past periods newest first, each with plan, bounds, used and limit")
    func historyFields() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, history, world.admin)
            #expect(status == .ok && json?["has_more"]?.boolValue == false)
            let periods = try #require(json?["data"]?.arrayValue)
            // The current period is not history; the past one used 1 + 6.
            #expect(periods.count == 1)
            #expect(periods.first?["period"]?["start"]?.stringValue == Timestamp.format(world.past.start))
            #expect(periods.first?["period"]?["end"]?.stringValue == Timestamp.format(world.past.end))
            #expect(periods.first?["plan"]?["id"]?.stringValue == "pro" && periods.first?["plan"]?["name"]?.stringValue == "Pro")
            #expect(periods.first?["used"]?.intValue == 7 && periods.first?["limit"]?.intValue == 1_000)
            #expect(periods.first?["company"]?["remaining"]?.intValue == 993)
            #expect(periods.first?["feature"]?.isNull == true)
        }
    }

    @Test("?feature= counts that feature's units against the plan's entitlement: 0 when the plan has none, null when unlimited")
    func historyOfFeature() async throws {
        try await world.app().test(.router) { client in
            let search = try await StoreWorld.get(client, history + "?feature=search", world.admin).1?["data"]?.arrayValue?.first
            #expect(search?["used"]?.intValue == 6 && search?["limit"]?.intValue == 50 && search?["feature"]?.stringValue == "search")
            let draft = try await StoreWorld.get(client, history + "?feature=draft", world.admin).1?["data"]?.arrayValue?.first
            #expect(draft?["used"]?.intValue == 0 && draft?["limit"]?.isNull == true)
            let other = try await StoreWorld.get(client, history + "?feature=translate", world.admin).1?["data"]?.arrayValue?.first
            #expect(other?["used"]?.intValue == 0 && other?["limit"]?.intValue == 0)
        }
    }

    @Test("?periods= bounds the list; outside 1…120 or not a number is 400 invalid_request_error")
    func historyPeriods() async throws {
        var changed = self.world
        changed.tenants.addPeriod(
            company: changed.acme, plan: "pro", start: changed.now - 70 * changed.day, end: changed.now - 40 * changed.day)
        let world = changed
        try await world.app().test(.router) { client in
            let two = try await StoreWorld.get(client, history, world.admin).1?["data"]?.arrayValue
            #expect(
                two?.compactMap { $0["period"]?["start"]?.stringValue }
                    == [world.past.start, world.now - 70 * world.day].map(Timestamp.format))
            #expect(try await StoreWorld.get(client, history + "?periods=1", world.admin).1?["data"]?.arrayValue?.count == 1)
            for bad in ["0", "121", "two", "-1", ""] {
                let (status, json) = try await StoreWorld.get(client, history + "?periods=\(bad)", world.admin)
                #expect(status == .badRequest, "periods=\(bad)")
                let error = StoreWorld.error(json)
                #expect(error.type == "invalid_request_error" && error.message == "'periods' must be a whole number from 1 to 120.")
            }
        }
    }

    @Test("a feature that is no feature id is 400 before anything is read")
    func historyBadFeature() async throws {
        try await world.app().test(.router) { client in
            for bad in ["Search", "a%20b", String(repeating: "x", count: 65)] {
                let (status, json) = try await StoreWorld.get(client, history + "?feature=\(bad)", world.admin)
                #expect(status == .badRequest, "feature=\(bad)")
                #expect(StoreWorld.error(json).message?.hasPrefix("'feature' must be a feature id") == true)
            }
        }
    }

    @Test("the history of an unknown company is 404 for the operator")
    func historyUnknown() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(
                client, "/admin/v1/companies/\(UUID().lowercased)/usage/history", world.operatorToken)
            #expect(status == .notFound && StoreWorld.error(json).message == "No company with that id.")
        }
    }
}
