import Foundation
import NIOCore
import Testing

@testable import CapGate

/// `capgate ledger export`'s pieces without a database: the month, the refusals made before the
/// database is reached, and the bytes of a row in each format.
@Suite("Ledger export: months and row bytes")
struct LedgerExportFormatTests {
    static let columns: [LedgerColumn] = [
        .init(name: "id", kind: .integer), .init(name: "route", kind: .text), .init(name: "created_at", kind: .timestamp),
        .init(name: "model", kind: .text),
    ]

    static func line(_ format: LedgerExportFormat, _ cells: [String?]) -> String {
        var out: [UInt8] = []
        LedgerRowEncoder(format: format, columns: columns).row(cells.map { $0.map { ByteBuffer(string: $0) } }, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test("a month is YYYY-MM exactly, in UTC, from its first instant to the next month's")
    func months() throws {
        let january = try #require(LedgerMonth("2026-01"))
        #expect(january.description == "2026-01" && january.firstDay == "2026-01-01")
        #expect(january.start == Timestamp.parse("2026-01-01T00:00:00Z"))
        #expect(january.end == Timestamp.parse("2026-02-01T00:00:00Z"))
        #expect(LedgerMonth("2025-12")?.end == Timestamp.parse("2026-01-01T00:00:00Z"))
        #expect(LedgerMonth("0999-02")?.description == "0999-02")
        for text in ["2026-13", "2026-00", "2026-1", "26-01", "2026/01", "2026-01-01", " 2026-01", "0000-01", "２０２６-01", "+202-01", ""] {
            #expect(LedgerMonth(text) == nil, "\(text)")
        }
        #expect(LedgerMonth(containing: try #require(Timestamp.parse("2026-02-28T23:59:59Z"))) == LedgerMonth("2026-02"))
    }

    @Test("refused before the database: a malformed month, one not over, an unknown format, a file or partial file that exists")
    func refusals() throws {
        let now = try #require(Timestamp.parse("2026-03-01T00:00:00Z"))
        let folder = NSTemporaryDirectory() + "ledger-export-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let file = folder + "/out.jsonl"
        #expect(throws: LedgerExport.Refusal.malformedMonth("2026-13")) {
            try LedgerExport.Request(month: "2026-13", path: file, now: now)
        }
        #expect(throws: LedgerExport.Refusal.monthNotEnded(LedgerMonth("2026-03")!)) {
            try LedgerExport.Request(month: "2026-03", path: file, now: now)
        }
        #expect(throws: LedgerExport.Refusal.unknownFormat("xml")) {
            try LedgerExport.Request(month: "2026-02", path: file, format: "xml", now: now)
        }
        // The month that ended at `now` exactly is whole.
        #expect(try LedgerExport.Request(month: "2026-02", path: file, now: now).absolutePath == file)
        _ = FileManager.default.createFile(atPath: file + ".partial", contents: Data())
        #expect(throws: LedgerExport.Refusal.fileExists(file + ".partial")) {
            try LedgerExport.Request(month: "2026-02", path: file, now: now)
        }
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        #expect(throws: LedgerExport.Refusal.fileExists(file)) { try LedgerExport.Request(month: "2026-02", path: file, now: now) }
    }

    @Test("JSON lines: fixed key order, numbers bare, null, escapes for quotes, backslashes and control characters, UTF-8 as is")
    func jsonLines() {
        #expect(
            Self.line(.jsonl, ["7", "/v1/a\"b\\c\nd\re\tf\u{1}", "2026-01-31T23:59:59.999999Z", nil])
                == #"{"id":7,"route":"/v1/a\"b\\c\nd\re\tf\u0001","created_at":"2026-01-31T23:59:59.999999Z","model":null}"# + "\n")
        #expect(Self.line(.jsonl, [nil, "", "x", "模型 é"]) == #"{"id":null,"route":"","created_at":"x","model":"模型 é"}"# + "\n")
    }

    @Test("CSV: RFC 4180 with CRLF; a header; NULL empty, empty text quoted; quotes doubled where a field needs them")
    func csv() {
        var header: [UInt8] = []
        LedgerRowEncoder(format: .csv, columns: Self.columns).header(into: &header)
        #expect(String(decoding: header, as: UTF8.self) == "id,route,created_at,model\r\n")
        var none: [UInt8] = []
        LedgerRowEncoder(format: .jsonl, columns: Self.columns).header(into: &none)
        #expect(none.isEmpty)
        #expect(Self.line(.csv, ["7", "/v1/a,b", "t", nil]) == "7,\"/v1/a,b\",t,\r\n")
        #expect(Self.line(.csv, [nil, "", "say \"hi\"", "line\nbreak\r\n"]) == ",\"\",\"say \"\"hi\"\"\",\"line\nbreak\r\n\"\r\n")
        #expect(Self.line(.csv, ["1", "=1+2", "-3", "模型 é"]) == "1,=1+2,-3,模型 é\r\n")
    }

    @Test("the export selects every column as text in one fixed form, the month's rows only, in a fixed order")
    func query() throws {
        let sql = LedgerExport.query(try #require(LedgerMonth("2026-01"))).sql
        #expect(sql.contains("to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"))
        #expect(sql.contains("company_id::text, id::text"))
        #expect(sql.contains("created_at >= $1 AND created_at < $2"))
        #expect(sql.hasSuffix("ORDER BY created_at, company_id, id"))
        #expect(Set(LedgerExport.columns.map(\.name)).count == LedgerExport.columns.count)
    }
}
