import Foundation
import HTTPTypes
import Testing

@testable import CapGate

/// What the admin and operator routes accept before they reach a store: route paths as calls
/// send them (SPEC §8), ids and slugs, webhook URLs (SPEC §9), query values (`limit`, `feature`,
/// days and times), page cursors, the events CSV's cells, and the general words a company admin
/// reads for a failed delivery (SPEC §9).
@Suite("Admin inputs: paths, ids, URLs, queries, cursors, CSV cells")
struct AdminInputTests {
    @Test("a route's path is stored as calls are matched: lower-cased, exact without its trailing '/', a prefix keeping its '*'")
    func routePaths() throws {
        let cases: [(String, String)] = [
            ("/v1/Models*", "/v1/models*"), ("/v1/messages/", "/v1/messages"), ("/v1/messages", "/v1/messages"), ("/v1/*", "/v1/*"),
            ("/v*", "/v*"), ("/*", "/*"), ("/v1/files/a%20b", "/v1/files/a%20b"),
        ]
        for (path, stored) in cases {
            #expect(try FeatureRoutes.routePath(path, prefix: "/v1/") == stored, "\(path)")
        }
    }

    @Test("a route path a call could not have, or outside the forward prefix, is 400")
    func routePathRefusals() {
        for path in ["v1/x", "/v1/*/x", "/v1/a b", "/v1/x?y=1", "/v1/x#y", "/v1//x", "/v1/./x", "/v1/%41", "/v1/é", "**", "/v1/x;y"] {
            #expect(UnitTestSupport.refusal { _ = try FeatureRoutes.routePath(path, prefix: "/v1/") }?.status == .badRequest, "\(path)")
        }
        #expect(
            UnitTestSupport.refusalMessage { _ = try FeatureRoutes.routePath("/admin/v1/x", prefix: "/v1/") }?.contains(
                "under the forward prefix /v1/")
                == true)
        #expect(UnitTestSupport.refusalMessage { _ = try FeatureRoutes.routePath("/v2*", prefix: "/v1/") } != nil)
    }

    @Test("slugs (plans, features): a lower-case letter or digit first, then '_', '.', '-'; route ids also take capitals; 1 to 64")
    func ids() {
        for id in ["pro", "a", "0", "a.b-c_d", String(repeating: "x", count: 64)] {
            #expect(OperatorRoutes.isSlug(id) && FeatureRoutes.isRouteID(id), "\(id)")
        }
        for id in ["", "-a", "_a", ".a", "Pro", "é", "a b", "a/b", String(repeating: "x", count: 65)] {
            #expect(!OperatorRoutes.isSlug(id), "\(id)")
        }
        #expect(FeatureRoutes.isRouteID("Route-1") && FeatureRoutes.isRouteID("R"))
        for id in ["", "-r", "_r", "r/1", "r 1", "ü", String(repeating: "R", count: 65)] {
            #expect(!FeatureRoutes.isRouteID(id), "\(id)")
        }
    }

    @Test("webhook_url: absent is no change, null the configured one; else http(s) with a host, no credentials, fragment or spaces")
    func webhookURLs() throws {
        func read(_ value: JSON?) throws -> String?? {
            try OperatorRoutes.webhookURL(BodyFields(fields: value.map { ["webhook_url": $0] } ?? [:], containsNUL: false))
        }
        #expect(try read(nil) == .none)
        #expect(try read(.null) == .some(nil))
        #expect(try read("https://hooks.example/capgate?x=1") == .some("https://hooks.example/capgate?x=1"))
        #expect(try read("http://10.0.0.5:8080/in") == .some("http://10.0.0.5:8080/in"))
        for url in [
            "ftp://hooks.example", "hooks.example/x", "https://user:pw@hooks.example/", "https://hooks.example/#x", "https:///x",
            "https://hooks.example/a b",
        ] {
            #expect(
                UnitTestSupport.refusalMessage { _ = try read(.string(url)) }?.hasPrefix(
                    "'webhook_url' must be an absolute http:// or https:// URL") == true,
                "\(url)")
        }
    }

    @Test("query values: limit within its range (default when absent), feature a slug, a time ISO-8601 (empty is none)")
    func queryValues() throws {
        #expect(try UsageRoutes.boundedInt(nil, name: "limit", default: 50, range: 1...500) == 50)
        #expect(try UsageRoutes.boundedInt("1", name: "limit", default: 50, range: 1...500) == 1)
        #expect(try UsageRoutes.boundedInt("500", name: "limit", default: 50, range: 1...500) == 500)
        for text in ["0", "501", "", "ten", "1.0", " 5", "5 "] {
            #expect(
                UnitTestSupport.refusalMessage { _ = try UsageRoutes.boundedInt(text, name: "limit", default: 50, range: 1...500) }
                    == "'limit' must be a whole number from 1 to 500.", "\(text)")
        }
        #expect(try UsageRoutes.feature(nil) == nil && UsageRoutes.feature("analysis") == "analysis")
        #expect(
            UnitTestSupport.refusalMessage { _ = try UsageRoutes.feature("Analysis") }?.hasPrefix("'feature' must be a feature id") == true)
        #expect(try UsageRoutes.time("", name: "from") == nil && UsageRoutes.time(nil, name: "from") == nil)
        #expect(try UsageRoutes.time("2026-11-01T01:00:00+01:00", name: "from") == UnitTestSupport.time("2026-11-01T00:00:00Z"))
        #expect(
            UnitTestSupport.refusalMessage { _ = try UsageRoutes.time("last week", name: "to") }?.hasPrefix("'to' must be an ISO-8601 time")
                == true)
    }

    @Test("the daily read's from/to: a day that exists (kept as text, the company's zone applies), or a time; anything else 400")
    func days() throws {
        guard case .date(let day)? = try ConsoleRoutes.day("2024-02-29", name: "from") else {
            Issue.record("a leap day is a day")
            return
        }
        #expect(day == "2024-02-29")
        guard case .time(let time)? = try ConsoleRoutes.day("2026-11-01T00:00:00Z", name: "to") else {
            Issue.record("a time is a time")
            return
        }
        #expect(time == UnitTestSupport.time("2026-11-01T00:00:00Z"))
        #expect(try ConsoleRoutes.day(nil, name: "from") == nil && ConsoleRoutes.day("", name: "from") == nil)
        for text in ["2026-02-30", "2023-02-29", "2026-13-01", "2026-1-01", "26-01-01x", "yesterday", "0000-01-01"] {
            #expect(
                UnitTestSupport.refusalMessage { _ = try ConsoleRoutes.day(text, name: "from") }?.hasPrefix("'from' must be a day such as")
                    == true, "\(text)"
            )
        }
    }

    @Test("pages: data, has_more and next_cursor (null on the last page), the same bytes from the JSON writer and the Encodable one")
    func pages() throws {
        let items: [JSON] = [1, 2]
        #expect(listJSON(items, hasMore: true, nextCursor: "42").serialized() == #"{"data":[1,2],"has_more":true,"next_cursor":"42"}"#)
        #expect(listJSON([]).serialized() == #"{"data":[],"has_more":false,"next_cursor":null}"#)
        #expect(
            String(decoding: try wireJSON(ListPage([1, 2], hasMore: true, nextCursor: "42")), as: UTF8.self)
                == listJSON(items, hasMore: true, nextCursor: "42").serialized())
        #expect(String(decoding: try wireJSON(ListPage([Int]())), as: UTF8.self) == listJSON([]).serialized())
    }

    @Test("a notification page's cursor: <micros>_<uuid> both ways; a cursor not made by CapGate is none")
    func notificationCursor() {
        let id = UUID(uuidString: "6F1C2A7E-93D4-4A55-9C61-0F3E2B1D9A10")!
        let cursor = NotificationStore.Cursor(micros: 1_793_491_200_000_000, id: id)
        #expect(cursor.text == "1793491200000000_6f1c2a7e-93d4-4a55-9c61-0f3e2b1d9a10")
        #expect(NotificationStore.Cursor(cursor.text) == cursor)
        #expect(NotificationStore.Cursor("0_6F1C2A7E-93D4-4A55-9C61-0F3E2B1D9A10") == NotificationStore.Cursor(micros: 0, id: id))
        for text in [
            "", "12", "-1_" + id.uuidString, "12_nope", "12_\(id.uuidString)_x", "1.5_\(id.uuidString)", "_\(id.uuidString)", "12__",
        ] {
            #expect(NotificationStore.Cursor(text) == nil, "\(text)")
        }
    }

    @Test(
        "a failed delivery in general words for a company admin (SPEC §9): the receiver's status, a timeout, else unreachable; never an address"
    )
    func deliveryErrors() {
        let cases: [(String, String)] = [
            ("HTTP 500 Internal Server Error", "receiver answered 500"), ("HTTP 404", "receiver answered 404"),
            ("timed out after 10 s", "timed out"), ("no answer in time", "timed out"), ("body stalled", "timed out"),
            ("Read Timeout", "timed out"), ("connect ECONNREFUSED 10.0.0.5:8443", "receiver unreachable"),
            ("TLS handshake failed for hooks.internal", "receiver unreachable"), ("HTTP abc", "receiver unreachable"),
            ("no signing secret", "not sent: the gateway has no signing secret configured"),
        ]
        for (recorded, shown) in cases {
            #expect(NotificationStore.generalError(recorded) == shown, "\(recorded)")
        }
    }

    @Test("events CSV cells: RFC 4180 quoting by scalar, quotes doubled, and a cell a spreadsheet would run neutralised with a '")
    func csvCells() {
        let cases: [(String, String)] = [
            ("plain", "plain"), ("", ""), ("a,b", #""a,b""#), (#"say "hi""#, #""say ""hi""""#), ("line\nbreak", "\"line\nbreak\""),
            ("crlf\r\nx", "\"crlf\r\nx\""), ("tab\tin", "\"tab\tin\""), ("=SUM(A1)", #""'=SUM(A1)""#), ("+1", #""'+1""#),
            ("-2", #""'-2""#), ("@cmd", #""'@cmd""#), ("\tx", "\"'\tx\""), ("=\"x\"", #""'=""x""""#), ("claude-x", "claude-x"),
        ]
        for (value, cell) in cases {
            #expect(UsageStore.Event.csvField(value) == cell, "\(value.debugDescription)")
        }
    }
}
