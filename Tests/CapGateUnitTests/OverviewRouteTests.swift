import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /admin/v1/companies` (SPEC §4, the operator's billing overview) and
/// `GET /admin/v1/companies/{id}/usage/models` (SPEC §11), through the gateway's router with
/// in-memory stores (``StoreWorld``).
@Suite("Overview and models routes with in-memory stores", .timeLimit(.minutes(1)))
struct OverviewRouteTests {
    let world = StoreWorld()

    var models: String { "/admin/v1/companies/\(world.acme.lowercased)/usage/models" }

    static func names(_ json: JSON?) -> [String] { json?["data"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? [] }

    @Test("every company by creation, with plan, period end, used, cap and percentage; no page asked, no more")
    func overview() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/admin/v1/companies", world.operatorToken)
            #expect(status == .ok)
            #expect(Self.names(json) == ["Acme", "Globex", "Idle"])
            #expect(json?["has_more"]?.boolValue == false && json?["next_cursor"]?.isNull == true)
            let rows = try #require(json?["data"]?.arrayValue)
            try #require(rows.count == 3)
            #expect(rows[0]["id"]?.stringValue == world.acme.lowercased)
            #expect(rows[0]["plan"]?.stringValue == "pro" && rows[0]["used"]?.intValue == 10 && rows[0]["cap"]?.intValue == 1_000)
            #expect(rows[0]["period_end"]?.stringValue == Timestamp.format(world.current.end))
            #expect(rows[0]["percent_used"]?.doubleValue == 1.0 && rows[1]["percent_used"]?.doubleValue == 90.0)
            #expect(rows[2]["plan"]?.isNull == true && rows[2]["cap"]?.isNull == true && rows[2]["percent_used"]?.isNull == true)
            #expect(rows[2]["period_end"]?.isNull == true && rows[2]["used"]?.intValue == 0)
        }
    }

    @Test("sort=usage puts the fullest first and a company without a cap last")
    func byUsage() async throws {
        try await world.app().test(.router) { client in
            let json = try await StoreWorld.get(client, "/admin/v1/companies?sort=usage", world.operatorToken).1
            #expect(Self.names(json) == ["Globex", "Acme", "Idle"])
        }
    }

    @Test("pages: limit and cursor walk the list, has_more and next_cursor say where it ends")
    func pages() async throws {
        try await world.app().test(.router) { client in
            var seen: [String] = []
            var cursor: String? = "0"
            var pages = 0
            while let next = cursor {
                let json = try await StoreWorld.get(client, "/admin/v1/companies?limit=2&cursor=\(next)", world.operatorToken).1
                seen += Self.names(json)
                cursor = json?["next_cursor"]?.stringValue
                #expect(json?["has_more"]?.boolValue == (cursor != nil))
                pages += 1
            }
            #expect(seen == ["Acme", "Globex", "Idle"] && pages == 2)
            let exact = try await StoreWorld.get(client, "/admin/v1/companies?limit=3", world.operatorToken).1
            #expect(exact?["has_more"]?.boolValue == false && exact?["next_cursor"]?.isNull == true)
            let past = try await StoreWorld.get(client, "/admin/v1/companies?limit=2&cursor=5", world.operatorToken).1
            #expect(Self.names(past).isEmpty && past?["has_more"]?.boolValue == false)
        }
    }

    @Test("limit, cursor and sort outside their values are 400 invalid_request_error naming them")
    func badQuery() async throws {
        try await world.app().test(.router) { client in
            let cases = [
                ("limit=0", "'limit' must be a whole number from 1 to 1000."),
                ("limit=1001", "'limit' must be a whole number from 1 to 1000."),
                ("limit=ten", "'limit' must be a whole number from 1 to 1000."),
                ("cursor=-1", "'cursor' must be a whole number from 0 to 1099511627776."),
                ("sort=name", "'sort' must be 'usage' or 'created'."),
            ]
            for (query, message) in cases {
                let (status, json) = try await StoreWorld.get(client, "/admin/v1/companies?\(query)", world.operatorToken)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(query)")
                #expect(error.message == message)
            }
        }
    }

    @Test("the overview is the operator's: a company admin is 403")
    func operatorOnly() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, "/admin/v1/companies", world.admin)
            #expect(status == .forbidden && StoreWorld.error(json).message == "Only the operator may do this.")
        }
    }

    @Test("models of the current period: charged calls by model, costliest first, with tokens, cost and what is held")
    func currentModels() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, models, world.admin)
            #expect(status == .ok)
            #expect(json?["period"]?["start"]?.stringValue == Timestamp.format(world.current.start))
            let rows = try #require(json?["models"]?.arrayValue)
            try #require(rows.count == 2)
            #expect(rows.compactMap { $0["model"]?.stringValue } == ["claude-sonnet-4-5", "claude-haiku-4-5"])
            // Sonnet: rows 4, 7 and 8 (6 was refunded); 4 settled at $0.003, 7 and 8 hold $0.0012.
            #expect(rows[0]["calls"]?.intValue == 3 && rows[0]["input_tokens"]?.intValue == 100 && rows[0]["output_tokens"]?.intValue == 20)
            #expect(rows[0]["cost_usd"]?.stringValue == "0.003" && rows[0]["held_usd"]?.stringValue == "0.0012")
            #expect(rows[1]["calls"]?.intValue == 1 && rows[1]["cost_usd"]?.stringValue == "0.001")
        }
    }

    @Test("?period= names a past period by its start day; a day no period starts on is 404, a bad day 400")
    func pastModels() async throws {
        try await world.app().test(.router) { client in
            let day = StoreWorld.day(world.past.start)
            let past = try await StoreWorld.get(client, models + "?period=\(day)", world.admin)
            #expect(past.0 == .ok && past.1?["period"]?["start"]?.stringValue == Timestamp.format(world.past.start))
            // Rows 1 and 2, both Sonnet: $0.0001 and $0.0006.
            let rows = past.1?["models"]?.arrayValue
            #expect(rows?.compactMap { $0["calls"]?.intValue } == [2] && rows?.first?["cost_usd"]?.stringValue == "0.0007")
            let none = try await StoreWorld.get(client, models + "?period=2001-01-01", world.admin)
            #expect(none.0 == .notFound)
            #expect(StoreWorld.error(none.1).message == "No period of this company starts on 2001-01-01 (see its usage history).")
            for bad in ["2026-02-30", "2026-1-01", "yesterday"] {
                let (status, json) = try await StoreWorld.get(client, models + "?period=\(bad)", world.admin)
                #expect(status == .badRequest, "\(bad)")
                #expect(StoreWorld.error(json).message?.hasPrefix("'period' must be the start date of a period") == true)
            }
        }
    }

    @Test("models of a company without a current period is 404 saying so; another company's admin is 403")
    func modelsRefused() async throws {
        try await world.app().test(.router) { client in
            let idle = try await StoreWorld.get(client, "/admin/v1/companies/\(world.idle.lowercased)/usage/models", world.operatorToken)
            #expect(idle.0 == .notFound && StoreWorld.error(idle.1).message == "The company has no current period (no plan).")
            #expect(try await StoreWorld.get(client, models, world.otherAdmin).0 == .forbidden)
            #expect(try await StoreWorld.get(client, models, world.member).0 == .forbidden)
        }
    }
}
