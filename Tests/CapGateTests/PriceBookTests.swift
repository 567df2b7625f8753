import CapGate
import Foundation
import NIOHTTP1
import Testing

/// SPEC §11's price book through the real server and PostgreSQL: the operator replaces and reads
/// the whole book exactly, a bad row changes nothing, and `capgate_price` picks the row in force.
@Suite("Price book: the operator API and capgate_price", .timeLimit(.minutes(5)))
struct PriceBookTests {
    static func row(
        _ model: String, _ from: String, window: Int64 = 200_000, input: String = "3", output: String = "15", long: JSON = .null
    ) -> JSON {
        .obj([
            "model": .string(model), "effective_from": .string(from), "context_window": .int(window), "input": .string(input),
            "output": .string(output), "cache_write_5m": "3.75", "cache_write_1h": "6", "cache_read": "0.3", "long_prompt": long,
        ])
    }

    static let longTier: JSON = .obj([
        "threshold_tokens": 200_000, "input": "6", "output": "22.5", "cache_write_5m": "7.5", "cache_write_1h": "12",
        "cache_read": "0.000001",
    ])

    @Test("PUT then GET round-trips the book exactly: decimal strings, micro-dollars, times, the long tier; PUT replaces it whole")
    func roundTrip() async throws {
        try await Harness.with { h in
            let empty = try await h.op(.GET, "/admin/v1/prices")
            #expect(empty.status == 200)
            #expect(empty.body == #"{"prices":[]}"#)

            let book: [JSON] = [
                Self.row(
                    "claude-sonnet-4*", "2026-01-01T00:00:00Z", window: 1_000_000, input: "3.75", output: "0.000001", long: Self.longTier),
                Self.row("claude-haiku-4-5", "2026-02-03T04:05:06.789Z", input: "999.999999", output: "0"),
            ]
            let put = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array(book)]))
            #expect(put.status == 200, "\(put.body)")
            let got = try await h.op(.GET, "/admin/v1/prices")
            #expect(got.status == 200)
            #expect(got.body == put.body)
            // Sorted by model: haiku first. Every member exactly as sent.
            #expect(got.json == JSON.obj(["prices": .array([book[1], book[0]])]).sortedKeys, "\(got.body)")
            #expect(try await h.scalar("SELECT input FROM prices WHERE model = 'claude-sonnet-4*'") == 3_750_000)
            #expect(try await h.scalar("SELECT output FROM prices WHERE model = 'claude-sonnet-4*'") == 1)
            #expect(try await h.scalar("SELECT long_prompt_cache_read FROM prices WHERE model = 'claude-sonnet-4*'") == 1)
            #expect(try await h.scalar("SELECT input FROM prices WHERE model = 'claude-haiku-4-5'") == 999_999_999)
            #expect(
                try await h.text("SELECT effective_from AT TIME ZONE 'UTC' FROM prices WHERE model = 'claude-haiku-4-5'")
                    == "2026-02-03 04:05:06.789")

            // The whole book is replaced: a row left out is gone.
            let replaced = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([book[1]])]))
            #expect(replaced.status == 200, "\(replaced.body)")
            #expect(try await h.scalar("SELECT count(*) FROM prices") == 1)
            // `long_prompt` is optional (SPEC §11): a row without it has no long tier, read back as null.
            let short: JSON = .obj([
                "model": "claude-opus-4*", "effective_from": "2026-01-01T00:00:00Z", "context_window": 200_000, "input": "5",
                "output": "25", "cache_write_5m": "6.25", "cache_write_1h": "10", "cache_read": "0.5",
            ])
            let withoutTier = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([short])]))
            #expect(withoutTier.status == 200, "\(withoutTier.body)")
            let read = try await h.op(.GET, "/admin/v1/prices")
            let stored = try #require(read.json["prices"]?.arrayValue?.first)
            #expect(stored["long_prompt"] == .null, "\(read.body)")
            #expect(stored["input"]?.stringValue == "5")
            #expect(try await h.scalar("SELECT count(*) FROM prices WHERE long_prompt_threshold IS NULL") == 1)

            #expect(try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([])])).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM prices") == 0)
        }
    }

    @Test("a book of 10,000 rows with long tiers is taken whole; 10,001 rows is 400 and changes nothing")
    func largestBook() async throws {
        try await Harness.with { h in
            let rows = (0..<10_001).map { i in
                Self.row("model-\(i)*", "2026-01-01T00:00:00Z", window: 1_000_000, input: "\(i).000001", long: Self.longTier)
            }
            let full = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array(Array(rows.prefix(10_000)))]))
            #expect(full.status == 200, "\(full.body.prefix(300))")
            #expect(try await h.scalar("SELECT count(*) FROM prices") == 10_000)
            #expect(try await h.scalar("SELECT input FROM capgate_price('model-9999-x', now())") == 9_999_000_001)
            let over = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array(rows)]))
            #expect(over.status == 400, "\(over.body.prefix(300))")
            #expect(try await h.scalar("SELECT count(*) FROM prices") == 10_000)
        }
    }

    @Test("each kind of bad row is 400 naming the row and the problem, and the old book stays")
    func badRowsChangeNothing() async throws {
        try await Harness.with { h in
            let good = Self.row("claude-sonnet-4*", "2026-01-01T00:00:00Z")
            let before = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([good])]))
            #expect(before.status == 200, "\(before.body)")
            let cases: [(JSON, String)] = [
                (Self.row("", "2026-01-01T00:00:00Z"), "'model'"),
                (Self.row("claude-*-x", "2026-01-01T00:00:00Z"), "'model'"),
                (Self.row(String(repeating: "m", count: 201), "2026-01-01T00:00:00Z"), "'model'"),
                (Self.row("m", "not a time"), "'effective_from'"),
                (Self.row("m", "2026-01-01T00:00:00Z", window: 0), "'context_window'"),
                (Self.row("m", "2026-01-01T00:00:00Z", input: "-3"), "'input'"),
                (Self.row("m", "2026-01-01T00:00:00Z", input: "3.1234567"), "'input'"),
                (Self.row("m", "2026-01-01T00:00:00Z", output: "1e2"), "'output'"),
                (Self.row("m", "2026-01-01T00:00:00Z", long: .obj(["threshold_tokens": 5])), "'long_prompt."),
                (Self.row("m", "2026-01-01T00:00:00Z", window: 100_000, long: Self.longTier), "must be below 'context_window'"),
                (Self.row("claude-sonnet-4*", "2026-01-01T00:00:00Z"), "repeats prices[0]"),
                (.obj(["model": "m", "surprise": 1]), "unknown member 'surprise'"),
            ]
            for (bad, expected) in cases {
                let reply = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array([good, bad])]))
                #expect(reply.status == 400, "\(bad.serialized()) → \(reply.status) \(reply.body)")
                #expect(reply.json["type"]?.stringValue == "error")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
                let message = reply.json["error"]?["message"]?.stringValue ?? ""
                #expect(message.hasPrefix("prices[1]"), "\(message)")
                #expect(message.contains(expected), "\(message)")
                if let model = bad["model"]?.stringValue, !model.isEmpty, model.count <= 200 {
                    #expect(message.contains("(model '\(model)')"), "\(message)")
                }
            }
            for body: JSON in [.obj(["prices": .array([good]), "extra": true]), .obj(["rows": .array([])]), .array([])] {
                #expect(try await h.op(.PUT, "/admin/v1/prices", body).status == 400, "\(body.serialized())")
            }
            #expect(try await h.op(.GET, "/admin/v1/prices").body == before.body)
        }
    }

    @Test("only the operator: a company admin and a member get 403 and change nothing; no credential 401")
    func operatorOnly() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 10, user: 10)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let admin = try await h.createUser(company: company, role: "admin")
            let body = JSON.obj(["prices": .array([Self.row("m", "2026-01-01T00:00:00Z")])])
            for key in [admin.key, users[0].key] {
                let read = try await h.request(.GET, "/admin/v1/prices", headers: [("x-api-key", key)])
                #expect(read.status == 403)
                #expect(read.json["error"]?["type"]?.stringValue == "permission_error")
                let write = try await h.request(.PUT, "/admin/v1/prices", headers: [("x-api-key", key)], json: body)
                #expect(write.status == 403)
            }
            #expect(try await h.request(.GET, "/admin/v1/prices").status == 401)
            #expect(try await h.scalar("SELECT count(*) FROM prices") == 0)
        }
    }

    /// capgate_price's `input` for `model` at `at`; nil when no row prices it.
    static func input(_ h: Harness, _ model: String, _ at: String) async throws -> Int64? {
        let sql = "SELECT count(*) FROM capgate_price('\(model)', '\(at)')"
        guard try await h.scalar(sql) == 1 else { return nil }
        return try await h.scalar("SELECT input FROM capgate_price('\(model)', '\(at)')")
    }

    @Test("capgate_price: exact beats prefix, a longer prefix beats a shorter one, the latest row in force wins, a future row waits")
    func pricePicking() async throws {
        try await Harness.with { h in
            let book: [JSON] = [
                Self.row("*", "2020-01-01T00:00:00Z", input: "100"),
                Self.row("claude-*", "2020-01-01T00:00:00Z", input: "50"),
                Self.row("claude-sonnet-4*", "2026-01-01T00:00:00Z", input: "3"),
                Self.row("claude-sonnet-4*", "2026-06-01T00:00:00Z", input: "2.5"),
                Self.row("claude-sonnet-4*", "2099-01-01T00:00:00Z", input: "1"),
                Self.row("claude-sonnet-4-5*", "2026-03-01T00:00:00Z", input: "4"),
                Self.row("claude-sonnet-4-6", "2026-09-01T00:00:00Z", input: "7"),
                Self.row("claude-sonnet-4-6", "2099-01-01T00:00:00Z", input: "8"),
            ]
            let put = try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array(book)]))
            #expect(put.status == 200, "\(put.body)")
            // Exact id beats every prefix once in force; before that, the longest prefix in force.
            #expect(try await Self.input(h, "claude-sonnet-4-6", "2026-10-01T00:00:00Z") == 7_000_000)
            #expect(try await Self.input(h, "claude-sonnet-4-6", "2026-08-01T00:00:00Z") == 2_500_000)
            // The latest effective_from <= the time; the boundary itself is in force.
            #expect(try await Self.input(h, "claude-sonnet-4-0", "2026-05-31T23:59:59Z") == 3_000_000)
            #expect(try await Self.input(h, "claude-sonnet-4-0", "2026-06-01T00:00:00Z") == 2_500_000)
            // A future row does not apply yet, and does not hide the one in force.
            #expect(try await Self.input(h, "claude-sonnet-4-0", "2098-12-31T00:00:00Z") == 2_500_000)
            #expect(try await Self.input(h, "claude-sonnet-4-0", "2099-01-01T00:00:00Z") == 1_000_000)
            #expect(try await Self.input(h, "claude-sonnet-4-6", "2099-06-01T00:00:00Z") == 8_000_000)
            // A longer prefix beats a shorter one; a prefix not yet in force gives way to a shorter one.
            #expect(try await Self.input(h, "claude-sonnet-4-5-20250929", "2026-04-01T00:00:00Z") == 4_000_000)
            #expect(try await Self.input(h, "claude-sonnet-4-5-20250929", "2026-02-01T00:00:00Z") == 3_000_000)
            #expect(try await Self.input(h, "claude-sonnet-4-5-20250929", "2025-01-01T00:00:00Z") == 50_000_000)
            #expect(try await Self.input(h, "claude-opus-4-1", "2026-01-01T00:00:00Z") == 50_000_000)
            // A prefix matches ids it starts; `*` alone matches any model.
            #expect(try await Self.input(h, "claude-sonnet-4", "2026-02-01T00:00:00Z") == 3_000_000)
            #expect(try await Self.input(h, "gpt-5", "2026-02-01T00:00:00Z") == 100_000_000)
            #expect(try await Self.input(h, "gpt-5", "2019-12-31T00:00:00Z") == nil)

            // Without the catch-all rows, an unknown model has no price.
            #expect(try await h.op(.PUT, "/admin/v1/prices", .obj(["prices": .array(Array(book.dropFirst(2)))])).status == 200)
            #expect(try await Self.input(h, "gpt-5", "2026-02-01T00:00:00Z") == nil)
            #expect(try await Self.input(h, "claude-sonnet", "2026-02-01T00:00:00Z") == nil)
            #expect(try await Self.input(h, "claude-sonnet-4-6", "2026-10-01T00:00:00Z") == 7_000_000)
        }
    }
}

extension JSON {
    /// This value with every object's keys in byte order (as the API's answers write them).
    var sortedKeys: JSON {
        switch self {
        case .object(let fields): .object(fields.sorted { $0.key < $1.key }.map { .init($0.key, $0.value.sortedKeys) })
        case .array(let items): .array(items.map(\.sortedKeys))
        default: self
        }
    }
}
