import NIOCore
import PostgresNIO

/// The file formats of `capgate ledger export`.
public enum LedgerExportFormat: String, Sendable, CaseIterable {
    /// One JSON object a line (`\n`), keys in the table's column order.
    case jsonl
    /// RFC 4180: a header line, then one record a row, `,` between fields, CRLF after each.
    case csv
}

/// One column of the ledger as the export writes it.
struct LedgerColumn: Sendable, Equatable {
    enum Kind: Sendable, Equatable {
        /// A whole number: a JSON number, a bare CSV field.
        case integer
        /// Text: a JSON string, a CSV field quoted when it needs to be.
        case text
        /// A `timestamptz`, written as RFC 3339 in UTC with microseconds: `2026-01-31T23:59:59.999999Z`.
        case timestamp
    }

    let name: String
    let kind: Kind

    /// What the export's query selects for this column: its text, in one fixed form whatever
    /// the session's settings (`TimeZone`, `DateStyle`), so that two exports give the same bytes.
    var selected: String {
        switch kind {
        case .integer, .text: "\(name)::text"
        case .timestamp: "to_char(\(name) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        }
    }
}

/// Turns ledger rows, each column's text (nil for SQL `NULL`), into the bytes of an export line.
///
/// - JSON lines: `{"company_id":"…","id":42,…,"settled_at":null}` and `\n`; integers as numbers,
///   everything else as strings; `"`, `\` and control characters escaped (`\n`, `\r`, `\t`,
///   `\u00XX`), every other character written as its UTF-8.
/// - CSV: NULL is an empty field, an empty text is `""`; a field holding `,`, `"`, CR or LF is
///   quoted with its quotes doubled. Cells are written as they are in the ledger (the events
///   export's guard against spreadsheet formulas would change them: an archive must read back
///   equal).
struct LedgerRowEncoder: Sendable {
    let format: LedgerExportFormat
    let columns: [LedgerColumn]
    /// `"name":` of each column, for JSON lines.
    private let keys: [[UInt8]]

    init(format: LedgerExportFormat, columns: [LedgerColumn]) {
        self.format = format
        self.columns = columns
        self.keys = columns.map { Array("\"\($0.name)\":".utf8) }
    }

    /// What comes before the first row: the CSV header line; nothing for JSON lines.
    func header(into out: inout [UInt8]) {
        guard format == .csv else { return }
        for (index, column) in columns.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: column.name.utf8)
        }
        out.append(contentsOf: Self.crlf)
    }

    /// Appends one row of the export's query (its cells in ``columns``' order).
    func row(_ row: PostgresRow, into out: inout [UInt8]) {
        begin(&out)
        var index = 0
        for cell in row {
            field(cell.bytes, at: index, into: &out)
            index += 1
        }
        end(&out)
    }

    /// Appends one row given as its cells' text, in ``columns``' order.
    func row(_ cells: [ByteBuffer?], into out: inout [UInt8]) {
        begin(&out)
        for index in cells.indices { field(cells[index], at: index, into: &out) }
        end(&out)
    }

    private func begin(_ out: inout [UInt8]) {
        if format == .jsonl { out.append(UInt8(ascii: "{")) }
    }

    private func end(_ out: inout [UInt8]) {
        switch format {
        case .jsonl: out.append(contentsOf: Self.objectEnd)
        case .csv: out.append(contentsOf: Self.crlf)
        }
    }

    /// One cell: its key first in JSON, a comma before all but the first.
    private func field(_ cell: ByteBuffer?, at index: Int, into out: inout [UInt8]) {
        if index > 0 { out.append(UInt8(ascii: ",")) }
        if format == .jsonl { out.append(contentsOf: keys[index]) }
        guard let cell else {
            if format == .jsonl { out.append(contentsOf: Self.null) }
            return
        }
        cell.withUnsafeReadableBytes { text in
            switch (format, columns[index].kind) {
            case (.jsonl, .integer): out.append(contentsOf: text)
            case (.jsonl, _): Self.appendJSONString(text, to: &out)
            case (.csv, _): Self.appendCSVField(text, to: &out)
            }
        }
    }

    private static let null = Array("null".utf8)
    private static let objectEnd = Array("}\n".utf8)
    private static let crlf = Array("\r\n".utf8)
    private static let hex = Array("0123456789abcdef".utf8)

    /// A JSON string of UTF-8 `text`. Bytes from 0x80 on are parts of multi-byte characters and
    /// pass through, so only ASCII needs looking at; runs that need no escape are copied whole.
    static func appendJSONString(_ text: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var plain = 0
        var index = 0
        while index < text.count {
            let byte = text[index]
            if byte >= 0x20 && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\") {
                index += 1
                continue
            }
            out.append(contentsOf: UnsafeRawBufferPointer(rebasing: text[plain..<index]))
            switch byte {
            case UInt8(ascii: "\n"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case UInt8(ascii: "\r"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case UInt8(ascii: "\t"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), byte])
            default:
                out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0x0f)]])
            }
            index += 1
            plain = index
        }
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: text[plain..<index]))
        out.append(UInt8(ascii: "\""))
    }

    /// An RFC 4180 field: quoted when empty (so that it differs from NULL) or when it holds a
    /// comma, a quote, CR or LF; quotes inside doubled.
    static func appendCSVField(_ text: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        var quoted = text.isEmpty
        var index = 0
        while index < text.count && !quoted {
            let byte = text[index]
            quoted = byte == UInt8(ascii: ",") || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\r") || byte == UInt8(ascii: "\n")
            index += 1
        }
        guard quoted else {
            out.append(contentsOf: text)
            return
        }
        out.append(UInt8(ascii: "\""))
        var plain = 0
        index = 0
        while index < text.count {
            if text[index] == UInt8(ascii: "\"") {
                // The quote is copied with the run before it, then once more.
                out.append(contentsOf: UnsafeRawBufferPointer(rebasing: text[plain...index]))
                plain = index
            }
            index += 1
        }
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: text[plain..<index]))
        out.append(UInt8(ascii: "\""))
    }
}
