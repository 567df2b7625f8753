import Foundation
import Testing

@testable import CapGate

/// `PUT /admin/v1/prices`'s body, read without a database: a good book is read exactly, and
/// each kind of bad row is a 400 naming its index, its model and the problem.
@Suite("Price book: the strict reading of a PUT body")
struct PriceBookReaderTests {
    static let row: JSON = .obj([
        "model": "claude-sonnet-4*", "effective_from": "2026-11-01T00:00:00Z", "context_window": 1_000_000, "input": "3",
        "output": "15", "cache_write_5m": "3.75", "cache_write_1h": "6", "cache_read": "0.3",
        "long_prompt": .obj([
            "threshold_tokens": 200_000, "input": "6", "output": "22.5", "cache_write_5m": "7.5", "cache_write_1h": "12",
            "cache_read": "0.6",
        ]),
    ])

    static func read(_ body: JSON) throws -> [PriceRecord] {
        guard case .object(let fields) = body else { throw GatewayError.invalidRequest("not an object") }
        return try PriceBookReader.read(
            BodyFields(fields: Dictionary(fields.map { ($0.key, $0.value) }, uniquingKeysWith: { _, b in b }), containsNUL: false))
    }

    /// `row` with `member` set to `value` (nil: removed).
    static func with(_ member: String, _ value: JSON?, in row: JSON = row) -> JSON {
        guard case .object(var fields) = row else { return row }
        fields.removeAll { $0.key == member }
        if let value { fields.append(.init(member, value)) }
        return .object(fields)
    }

    /// The 400's message for a book of a good row then `bad`.
    static func problem(_ bad: JSON) -> String? {
        do {
            _ = try read(.obj(["prices": .array([row, bad])]))
            return nil
        } catch let error as GatewayError {
            return error.status == .badRequest ? error.message : nil
        } catch {
            return nil
        }
    }

    @Test("a good row is read exactly, long tier included, null or absent (SPEC §11: optional)")
    func good() throws {
        let rows: [JSON] = [
            Self.row, Self.with("long_prompt", .null, in: Self.with("model", "x")),
            Self.with("long_prompt", nil, in: Self.with("model", "y")),
        ]
        let book = try Self.read(.obj(["prices": .array(rows)]))
        #expect(book.count == 3)
        #expect(book[2].model == "y" && book[2].longPrompt == nil)
        #expect(book[0].model == "claude-sonnet-4*")
        #expect(book[0].effectiveFrom == Date(timeIntervalSince1970: 1_793_491_200))
        #expect(book[0].rates.cacheWrite5m == Micros(3_750_000))
        #expect(book[0].longPrompt?.thresholdTokens == 200_000)
        #expect(book[0].longPrompt?.rates.output == Micros(22_500_000))
        #expect(book[1].longPrompt == nil)
        #expect(try Self.read(.obj(["prices": .array([])])).isEmpty)
        // The answer's JSON: every member, rates as decimal strings.
        let text = String(decoding: try wireJSON(PriceBook(book)), as: UTF8.self)
        #expect(text.contains(#""cache_write_5m":"3.75""#), "\(text)")
        #expect(text.contains(#""long_prompt":null"#), "\(text)")
        #expect(text.contains(#""effective_from":"2026-11-01T00:00:00Z""#), "\(text)")
        #expect(try JSONDecoder().decode(PriceBook.self, from: Data(text.utf8)) == PriceBook(book))
    }

    @Test("each kind of bad row is a 400 that names the row's index, its model and the problem")
    func badRows() {
        let cases: [(JSON, String)] = [
            (Self.with("model", ""), "'model'"), (Self.with("model", "a*b"), "'model'"), (Self.with("model", "a b"), "'model'"),
            (Self.with("model", .string(String(repeating: "m", count: 201))), "'model'"), (Self.with("model", 5), "'model'"),
            (Self.with("model", nil), "'model' is required"), (Self.with("effective_from", "yesterday"), "'effective_from'"),
            (Self.with("effective_from", "2026-11-01"), "'effective_from'"),
            (Self.with("effective_from", "2024-01-01T12:99:00Z"), "'effective_from'"),
            (Self.with("effective_from", "2023-02-29T00:00:00Z"), "'effective_from'"),
            (Self.with("effective_from", "2024-01-01T00:00:00"), "'effective_from'"),
            (Self.with("effective_from", "2024-01-01 00:00:00Z"), "'effective_from'"),
            (Self.with("effective_from", "1969-12-31T23:59:59Z"), "'effective_from'"), (Self.with("context_window", 0), "'context_window'"),
            (Self.with("context_window", 100_000_001), "'context_window'"), (Self.with("context_window", "5"), "'context_window'"),
            (Self.with("input", "-1"), "'input'"), (Self.with("input", 3), "'input'"), (Self.with("output", "1e3"), "'output'"),
            (Self.with("cache_read", "0.0000001"), "'cache_read'"), (Self.with("cache_write_1h", "10000.000001"), "'cache_write_1h'"),
            (Self.with("cache_write_5m", nil), "'cache_write_5m' is required"), (Self.with("colour", "red"), "unknown member 'colour'"),
            (Self.with("long_prompt", 5), "'long_prompt'"),
            (.string("row"), "JSON object"),
            (Self.with("long_prompt", .obj(["threshold_tokens": 10])), "'long_prompt.cache_read' is required"),
            (
                Self.with("long_prompt", Self.with("extra", 1, in: Self.row["long_prompt"]!)),
                "unknown member 'long_prompt.extra'"
            ),
            (
                Self.with("long_prompt", Self.with("threshold_tokens", 1_000_000, in: Self.row["long_prompt"]!)),
                "'long_prompt.threshold_tokens' (1000000) must be below 'context_window'"
            ),
            (Self.with("long_prompt", Self.with("cache_read", "x", in: Self.row["long_prompt"]!)), "'long_prompt.cache_read'"),
            (Self.row, "repeats prices[0]"),
            (Self.with("effective_from", "2026-11-01T01:00:00+01:00"), "repeats prices[0]"),
        ]
        for (bad, expected) in cases {
            let message = Self.problem(bad)
            #expect(message?.hasPrefix("prices[1]") == true, "\(bad.serialized()) → \(message ?? "accepted")")
            #expect(message?.contains(expected) == true, "\(bad.serialized()) → \(message ?? "accepted")")
            if let model = bad["model"]?.stringValue, model.count < 100 {
                #expect(message?.contains("(model '\(model)')") == true, "\(message ?? "accepted")")
            }
        }
    }

    @Test("effective_from is RFC 3339 read strictly: offsets, fractions to the nearest millisecond, leap days")
    func times() {
        let cases: [(String, Double)] = [
            ("2026-11-01T00:00:00Z", 1_793_491_200), ("2026-11-01t00:00:00z", 1_793_491_200),
            ("2026-11-01T01:30:00+01:30", 1_793_491_200), ("2026-10-31T20:00:00-04:00", 1_793_491_200),
            ("2026-11-01T00:00:00.25Z", 1_793_491_200.25), ("2026-11-01T00:00:00.1234Z", 1_793_491_200.123),
            ("2026-11-01T00:00:00.9995Z", 1_793_491_201), ("2024-02-29T00:00:00Z", 1_709_164_800), ("1970-01-01T00:00:00Z", 0),
        ]
        for (text, seconds) in cases {
            #expect(Timestamp.parseStrict(text) == Date(timeIntervalSince1970: seconds), "\(text)")
        }
        for text in [
            "2026-11-01", "2026-13-01T00:00:00Z", "2026-11-31T00:00:00Z", "2026-11-01T24:00:00Z", "2026-11-01T00:60:00Z",
            "2026-11-01T00:00:60Z", "2026-11-01T00:00:00.Z", "2026-11-01T00:00:00+1:00", "2026-11-01T00:00:00+01:60",
            "2026-11-01T00:00:00Z ", "+2026-11-01T00:00:00Z", "2026-11-01T00:00:00+0100",
        ] {
            #expect(Timestamp.parseStrict(text) == nil, "\(text)")
        }
        #expect(PriceRecord.timeText(Timestamp.parseStrict("2026-02-03T04:05:06.789Z")!) == "2026-02-03T04:05:06.789Z")
    }

    @Test("the body: only 'prices', a list, at most 10,000 rows")
    func body() {
        for bad: JSON in [
            .obj([:]), .obj(["prices": .obj([:])]), .obj(["prices": .array([]), "extra": 1]), .obj(["prices": .null]),
            .obj(["prices": .array(Array(repeating: .null, count: PriceBookReader.maxRows + 1))]),
        ] {
            #expect(throws: GatewayError.self, "\(bad.serialized().prefix(80))") { try Self.read(bad) }
        }
    }
}
