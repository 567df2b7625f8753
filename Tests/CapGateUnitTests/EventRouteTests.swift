import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import CapGate

/// `GET /admin/v1/companies/{id}/events` (SPEC §4: the ledger, paged, or CSV), through the
/// gateway's router with in-memory stores (``StoreWorld``: Acme's rows are 1, 2 and 4–8).
@Suite("Ledger events route with in-memory stores", .timeLimit(.minutes(1)))
struct EventRouteTests {
    let world = StoreWorld()

    var events: String { "/admin/v1/companies/\(world.acme.lowercased)/events" }

    static func ids(_ json: JSON?) -> [Int64] { json?["data"]?.arrayValue?.compactMap { $0["id"]?.intValue } ?? [] }

    @Test("a page is the company's rows only, oldest first, every field the SPEC names")
    func fields() async throws {
        try await world.app().test(.router) { client in
            let (status, json) = try await StoreWorld.get(client, events, world.admin)
            #expect(status == .ok)
            #expect(Self.ids(json) == [1, 2, 4, 5, 6, 7, 8])
            #expect(json?["has_more"]?.boolValue == false && json?["next_cursor"]?.isNull == true)
            let row = try #require(json?["data"]?.arrayValue?.dropFirst(2).first)
            #expect(row["company_id"]?.stringValue == world.acme.lowercased && row["user_id"]?.stringValue == world.acmeMember.lowercased)
            #expect(row["units"]?.intValue == 2 && row["feature"]?.stringValue == "search" && row["outcome"]?.stringValue == "charged")
            #expect(row["period"]?["start"]?.stringValue == Timestamp.format(world.current.start))
            #expect(row["input_tokens"]?.intValue == 100 && row["cost_usd"]?.stringValue == "0.003")
            #expect(row["time"]?.stringValue == Timestamp.format(world.now - 5 * world.day))
            let keys = Set(row.objectFields?.map(\.key) ?? [])
            let expected: Set = [
                "id", "time", "company_id", "user_id", "period", "units", "input_tokens", "output_tokens", "method", "route", "model",
                "feature", "outcome", "upstream_status", "request_id", "idempotency_key", "settlement", "cache_write_tokens",
                "cache_read_tokens", "hold_usd", "cost_usd", "cost_source",
            ]
            #expect(keys == expected)
        }
    }

    @Test("settlement: a refund and a settled charge are settled, an open charge pending within the grace, unsettled after")
    func settlement() async throws {
        try await world.app().test(.router) { client in
            let rows = try await StoreWorld.get(client, events, world.admin).1?["data"]?.arrayValue ?? []
            let byID = Dictionary(uniqueKeysWithValues: rows.compactMap { row in row["id"]?.intValue.map { ($0, row) } })
            #expect(byID[6]?["outcome"]?.stringValue == "refunded" && byID[6]?["settlement"]?.stringValue == "settled")
            #expect(byID[5]?["settlement"]?.stringValue == "settled")
            #expect(byID[7]?["settlement"]?.stringValue == "unsettled" && byID[7]?["hold_usd"]?.stringValue == "0.0007")
            #expect(byID[8]?["settlement"]?.stringValue == "pending" && byID[8]?["cost_usd"]?.isNull == true)
        }
    }

    @Test("limit and cursor page through every row once; the last page has no more and no cursor")
    func pagesAscending() async throws {
        try await world.app().test(.router) { client in
            var seen: [Int64] = []
            var uri = events + "?limit=3"
            for page in 1...3 {
                let json = try await StoreWorld.get(client, uri, world.admin).1
                seen += Self.ids(json)
                let more = json?["has_more"]?.boolValue == true
                #expect(more == (page < 3))
                guard let next = json?["next_cursor"]?.stringValue else { break }
                #expect(next == String(seen.last ?? 0))
                uri = events + "?limit=3&cursor=\(next)"
            }
            #expect(seen == [1, 2, 4, 5, 6, 7, 8])
            // A page that ends exactly at the last row has no more.
            let exact = try await StoreWorld.get(client, events + "?limit=7", world.admin).1
            #expect(Self.ids(exact).count == 7 && exact?["has_more"]?.boolValue == false && exact?["next_cursor"]?.isNull == true)
        }
    }

    @Test("order=desc pages newest first, its cursor walking back")
    func pagesDescending() async throws {
        try await world.app().test(.router) { client in
            let first = try await StoreWorld.get(client, events + "?order=desc&limit=4", world.admin).1
            #expect(Self.ids(first) == [8, 7, 6, 5] && first?["next_cursor"]?.stringValue == "5")
            let second = try await StoreWorld.get(client, events + "?order=desc&limit=4&cursor=5", world.admin).1
            #expect(Self.ids(second) == [4, 2, 1] && second?["has_more"]?.boolValue == false)
        }
    }

    @Test("from is inclusive and to exclusive; feature= keeps that feature's rows")
    func filters() async throws {
        try await world.app().test(.router) { client in
            let from = Timestamp.format(world.now - 5 * world.day)
            let to = Timestamp.format(world.now - 3 * world.day)
            let window = try await StoreWorld.get(client, events + "?from=\(from)&to=\(to)", world.admin).1
            #expect(Self.ids(window) == [4, 5])
            #expect(Self.ids(try await StoreWorld.get(client, events + "?feature=search", world.admin).1) == [2, 4])
            #expect(Self.ids(try await StoreWorld.get(client, events + "?feature=draft", world.admin).1).isEmpty)
        }
    }

    @Test("bad from, to, order, cursor, limit or feature is 400 invalid_request_error saying which")
    func badQuery() async throws {
        try await world.app().test(.router) { client in
            let cases = [
                ("from=yesterday", "'from' must be an ISO-8601 time such as 2026-11-01T00:00:00Z."),
                ("to=2026-13-01T00:00:00Z", "'to' must be an ISO-8601 time such as 2026-11-01T00:00:00Z."),
                ("from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z", "'from' must not be after 'to'."),
                ("order=sideways", "'order' must be 'asc' (oldest first, the default) or 'desc' (newest first)."),
                ("cursor=-1", "'cursor' must be a cursor from a previous page."),
                ("cursor=abc", "'cursor' must be a cursor from a previous page."),
                ("limit=0", "'limit' must be a whole number from 1 to 1000."),
                ("limit=1001", "'limit' must be a whole number from 1 to 1000."),
            ]
            for (query, message) in cases {
                let (status, json) = try await StoreWorld.get(client, events + "?" + query, world.admin)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(query)")
                #expect(error.message == message, "\(query)")
            }
        }
    }

    @Test("Accept: text/csv gives the whole range as CSV: the header, a line per row, as an attachment")
    func csv() async throws {
        try await world.app().test(.router) { client in
            let response = try await client.execute(
                uri: events + "?limit=1&order=desc", method: .get, headers: world.admin.merging([.accept: "text/csv"]))
            #expect(response.status == .ok)
            #expect(response.headers[.contentType] == "text/csv; charset=utf-8")
            #expect(response.headers[.contentDisposition] == "attachment; filename=\"events.csv\"")
            let lines = String(buffer: response.body).split(separator: "\n")
            #expect(lines.first.map(String.init) == UsageStore.Event.csvHeader.trimmingCharacters(in: .newlines))
            // Whatever limit and order say: every row, oldest first.
            #expect(
                lines.dropFirst().compactMap { $0.split(separator: ",").first.map(String.init) } == ["1", "2", "4", "5", "6", "7", "8"])
        }
    }

    @Test("another company's admin and a member are 403; an unknown company is 404 for the operator")
    func refused() async throws {
        try await world.app().test(.router) { client in
            #expect(try await StoreWorld.get(client, events, world.otherAdmin).0 == .forbidden)
            #expect(try await StoreWorld.get(client, events, world.member).0 == .forbidden)
            let unknown = try await StoreWorld.get(client, "/admin/v1/companies/\(UUID().lowercased)/events", world.operatorToken)
            #expect(unknown.0 == .notFound && StoreWorld.error(unknown.1).type == "not_found_error")
            let globex = try await StoreWorld.get(client, "/admin/v1/companies/\(world.globex.lowercased)/events", world.operatorToken)
            #expect(Self.ids(globex.1) == [3])
        }
    }
}

extension HTTPFields {
    /// These fields with `other`'s added.
    func merging(_ other: HTTPFields) -> HTTPFields {
        var fields = self
        fields.append(contentsOf: other)
        return fields
    }
}
