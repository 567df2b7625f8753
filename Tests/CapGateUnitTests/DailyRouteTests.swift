import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /admin/v1/companies/{id}/usage/daily` (SPEC §10, the console's chart), through the
/// gateway's router with in-memory stores (``StoreWorld``).
@Suite("Console daily route with in-memory stores", .timeLimit(.minutes(1)))
struct DailyRouteTests {
    let world = StoreWorld()

    var daily: String { "/admin/v1/companies/\(world.acme.lowercased)/usage/daily" }

    @Test("every day of the range, charged units split by feature, 0 where nothing was charged")
    func days() async throws {
        try await world.app().test(.router) { client in
            let from = StoreWorld.day(world.now - 6 * world.day)
            let to = StoreWorld.day(world.now - 2 * world.day)
            let (status, json) = try await StoreWorld.get(client, daily + "?from=\(from)&to=\(to)", world.admin)
            #expect(status == .ok)
            let days = try #require(json?.arrayValue)
            try #require(days.count == 5)
            #expect(
                days.compactMap { $0["date"]?.stringValue } == (2...6).reversed().map { StoreWorld.day(world.now - Double($0) * world.day) }
            )
            // Rows 4 (2, search), 5 (3), 6 (refunded: nothing), 7 (1).
            #expect(days.map { $0["units"]?.intValue } == [0, 2, 3, 0, 1])
            #expect(days[1]["features"]?["search"]?.intValue == 2)
            #expect(days[2]["features"]?.objectFields?.isEmpty == true)
        }
    }

    @Test("a time as a bound names its day; the days are the company's zone's (Globex: Asia/Tokyo)")
    func zone() async throws {
        try await world.app().test(.router) { client in
            let call = world.now - 5 * world.day
            let tokyo = StoreWorld.day(call, zone: "Asia/Tokyo")
            let uri = "/admin/v1/companies/\(world.globex.lowercased)/usage/daily?from=\(Timestamp.format(call))&to=\(tokyo)"
            let days = try await StoreWorld.get(client, uri, world.otherAdmin).1?.arrayValue
            #expect(days?.count == 1 && days?.first?["date"]?.stringValue == tokyo && days?.first?["units"]?.intValue == 9)
        }
    }

    @Test("no bounds: from the current period's first day to today")
    func defaultRange() async throws {
        try await world.app().test(.router) { client in
            let days = try await StoreWorld.get(client, daily, world.admin).1?.arrayValue ?? []
            #expect(days.first?["date"]?.stringValue == StoreWorld.day(world.current.start))
            #expect(days.last?["date"]?.stringValue == StoreWorld.day(Date()))
            #expect(days.reduce(0) { $0 + ($1["units"]?.intValue ?? 0) } == 10)
        }
    }

    @Test("a day that does not exist, a bad time, from after to, or more than 400 days is 400 invalid_request_error")
    func badBounds() async throws {
        try await world.app().test(.router) { client in
            let dayMessage = "'from' must be a day such as 2026-11-01 or an ISO-8601 time such as 2026-11-01T00:00:00Z."
            let cases = [
                ("from=2026-02-30", dayMessage), ("from=2026-2-01", dayMessage), ("from=soon", dayMessage),
                ("to=2026-11-31", "'to' must be a day such as 2026-11-01 or an ISO-8601 time such as 2026-11-01T00:00:00Z."),
                ("from=2026-11-02&to=2026-11-01", "'from' must not be after 'to'."),
                ("from=2025-01-01&to=2026-11-01", "A daily read spans at most 400 days; narrow 'from' and 'to'."),
            ]
            for (query, message) in cases {
                let (status, json) = try await StoreWorld.get(client, daily + "?" + query, world.admin)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(query)")
                #expect(error.message == message, "\(query)")
            }
        }
    }

    @Test("another company's admin and a member are 403; an unknown company is 404 for the operator")
    func refused() async throws {
        try await world.app().test(.router) { client in
            #expect(try await StoreWorld.get(client, daily, world.otherAdmin).0 == .forbidden)
            #expect(try await StoreWorld.get(client, daily, world.member).0 == .forbidden)
            let unknown = try await StoreWorld.get(client, "/admin/v1/companies/\(UUID().lowercased)/usage/daily", world.operatorToken)
            #expect(unknown.0 == .notFound && StoreWorld.error(unknown.1).message == "No company with that id.")
        }
    }
}
