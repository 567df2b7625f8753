import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import CapGate

/// `GET /admin/v1/companies/{id}/notifications` (SPEC §9), through the gateway's router with the
/// in-memory notifications of ``StoreWorld``: newest first with their delivery state, errors in
/// general words for a company's admin, the cursor walking rows of the same time.
@Suite("Notifications route with in-memory stores", .timeLimit(.minutes(1)))
struct NotificationRouteTests {
    let world = StoreWorld()

    /// Ids whose order is known (uuids compare as their lowercase text).
    static let ids = (1...5).map { UUID(uuidString: "00000000-0000-4000-8000-00000000000\($0)")! }

    /// Acme: 1 delivered (5 days ago), 2 failed with an HTTP error (3 days ago, the member's
    /// counter), 3 and 4 pending at the same time (a day ago, 3 timed out); Globex: 5.
    static func rows(_ w: StoreWorld) -> InMemoryNotifications {
        func payload(_ n: Int, _ company: UUID, at: Date, user: (UUID, String?)? = nil) -> NotificationPayload {
            NotificationPayload(
                companyID: company, id: ids[n - 1], createdAt: at, companyName: company == w.acme ? "Acme" : "Globex", user: user,
                scope: user == nil ? "company" : "user", feature: nil, window: "period", windowStart: w.current.start,
                windowEnd: w.current.end, threshold: 80, used: 800, limit: 1_000)
        }
        let day = w.day
        return InMemoryNotifications([
            .init(payload: payload(1, w.acme, at: w.now - 5 * day), status: "delivered", attempts: 1, deliveredAt: w.now - 5 * day),
            .init(
                payload: payload(2, w.acme, at: w.now - 3 * day, user: (w.acmeMember, "max@acme.test")), status: "failed", attempts: 12,
                lastError: "HTTP 500 from https://hooks.acme.test/cg"),
            .init(
                payload: payload(3, w.acme, at: w.now - day), status: "pending", attempts: 2,
                lastError: "connect to 10.0.0.5:443 timed out", nextAttemptAt: w.now + 60),
            .init(payload: payload(4, w.acme, at: w.now - day), status: "pending", attempts: 0, nextAttemptAt: w.now + 5),
            .init(payload: payload(5, w.globex, at: w.now - 2 * day), status: "delivered", attempts: 1, deliveredAt: w.now - 2 * day),
        ])
    }

    var uri: String { "/admin/v1/companies/\(world.acme.lowercased)/notifications" }

    static func ids(_ json: JSON?) -> [String] { json?["data"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? [] }

    static func lower(_ n: Int...) -> [String] { n.map { ids[$0 - 1].uuidString.lowercased() } }

    @Test("a company's admin reads its notifications newest first, each with the webhook's fields and its delivery state")
    func list() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, uri, world.admin)
            #expect(status == .ok && Self.ids(json) == Self.lower(4, 3, 2, 1))
            let rows = try #require(json?["data"]?.arrayValue)
            try #require(rows.count == 4)
            #expect(rows.map { $0["status"]?.stringValue } == ["pending", "pending", "failed", "delivered"])
            #expect(rows.map { $0["attempts"]?.intValue } == [0, 2, 12, 1])
            #expect(rows[0]["next_attempt_at"]?.stringValue == Timestamp.format(world.now + 5))
            #expect(
                rows[2]["next_attempt_at"]?.isNull == true
                    && rows[3]["delivered_at"]?.stringValue == Timestamp.format(world.now - 5 * world.day))
            #expect(rows[2]["user"]?["email"]?.stringValue == "max@acme.test" && rows[3]["user"]?.isNull == true)
            #expect(rows[0]["type"]?.stringValue == "usage.threshold" && rows[0]["company"]?["name"]?.stringValue == "Acme")
            #expect(rows[0]["threshold"]?.intValue == 80 && rows[0]["used"]?.intValue == 800 && rows[0]["limit"]?.intValue == 1_000)
        }
    }

    @Test("last_error: general words for a company's admin, what the deliverer recorded for the operator")
    func errors() async throws {
        try await world.app().test(.router) { client in
            let admin = try await StoreWorld.get(client, uri, world.admin).1?["data"]?.arrayValue ?? []
            #expect(admin.map { $0["last_error"]?.stringValue } == [nil, "timed out", "receiver answered 500", nil])
            let op = try await StoreWorld.get(client, uri, world.operatorToken).1?["data"]?.arrayValue ?? []
            #expect(
                op.map { $0["last_error"]?.stringValue } == [
                    nil, "connect to 10.0.0.5:443 timed out", "HTTP 500 from https://hooks.acme.test/cg", nil,
                ])
        }
    }

    @Test("status= keeps one state; another word is 400")
    func statusFilter() async throws {
        try await world.app().test(.router) { client in
            #expect(Self.ids(try await StoreWorld.get(client, uri + "?status=pending", world.admin).1) == Self.lower(4, 3))
            #expect(Self.ids(try await StoreWorld.get(client, uri + "?status=failed", world.admin).1) == Self.lower(2))
            let (status, json) = try await StoreWorld.get(client, uri + "?status=sent", world.admin)
            #expect(status == .badRequest && StoreWorld.error(json).message == "'status' must be pending, delivered or failed.")
        }
    }

    @Test("a page of one at a time walks every row once, the two of the same time too; then no more")
    func pages() async throws {
        try await world.app().test(.router) { client in
            var seen: [String] = []
            var query = "?limit=1"
            for _ in 1...5 {
                let json = try await StoreWorld.get(client, uri + query, world.admin).1
                seen += Self.ids(json)
                guard let next = json?["next_cursor"]?.stringValue else {
                    #expect(json?["has_more"]?.boolValue == false)
                    break
                }
                #expect(json?["has_more"]?.boolValue == true)
                query = "?limit=1&cursor=\(next)"
            }
            #expect(seen == Self.lower(4, 3, 2, 1))
        }
    }

    @Test("a cursor no page gave and a limit outside 1…500 are 400 invalid_request_error")
    func badQuery() async throws {
        try await world.app().test(.router) { client in
            let cursor = "'cursor' must be a cursor from a previous page."
            let cases = [
                ("cursor=x", cursor), ("cursor=12_notauuid", cursor), ("cursor=-1_\(Self.ids[0].uuidString)", cursor),
                ("limit=0", "'limit' must be a whole number from 1 to 500."),
                ("limit=501", "'limit' must be a whole number from 1 to 500."),
            ]
            for (query, message) in cases {
                let (status, json) = try await StoreWorld.get(client, uri + "?" + query, world.admin)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(query)")
                #expect(error.message == message, "\(query)")
            }
        }
    }

    @Test("another company's admin and a member are 403; Globex's admin reads Globex's only; an unknown company 404")
    func scoped() async throws {
        try await world.app().test(.router) { client in
            #expect(try await StoreWorld.get(client, uri, world.otherAdmin).0 == .forbidden)
            #expect(try await StoreWorld.get(client, uri, world.member).0 == .forbidden)
            let globex = try await StoreWorld.get(client, "/admin/v1/companies/\(world.globex.lowercased)/notifications", world.otherAdmin)
            #expect(Self.ids(globex.1) == Self.lower(5))
            let unknown = try await StoreWorld.get(client, "/admin/v1/companies/\(UUID().lowercased)/notifications", world.operatorToken)
            #expect(unknown.0 == .notFound && StoreWorld.error(unknown.1).message == "No company with that id.")
        }
    }
}
