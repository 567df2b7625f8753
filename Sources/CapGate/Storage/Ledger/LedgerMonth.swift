import Foundation

/// A calendar month in UTC, as `capgate ledger export --month YYYY-MM` names it: the ledger rows
/// whose `created_at` is in [``start``, ``end``).
public struct LedgerMonth: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let year: Int
    public let month: Int

    /// `YYYY-MM` exactly (four digits, a hyphen, two digits; year 1 to 9999, month 01 to 12), else nil.
    public init?(_ text: String) {
        let bytes = Array(text.utf8)
        guard bytes.count == 7, bytes[4] == UInt8(ascii: "-") else { return nil }
        let digits = bytes[0..<4] + bytes[5..<7]
        guard digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        guard let year = Int(String(decoding: bytes[0..<4], as: UTF8.self)),
            let month = Int(String(decoding: bytes[5..<7], as: UTF8.self)), year >= 1, (1...12).contains(month)
        else { return nil }
        self.year = year
        self.month = month
    }

    /// The month that contains `date` (UTC).
    public init(containing date: Date) {
        let parts = Self.calendar.dateComponents([.year, .month], from: date)
        year = parts.year!
        month = parts.month!
    }

    static let calendar: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }()

    /// The first instant of the month (UTC).
    public var start: Date {
        Self.calendar.date(from: DateComponents(year: year, month: month, day: 1))!
    }

    /// The first instant of the next month (UTC): the end, not included.
    public var end: Date {
        Self.calendar.date(from: DateComponents(year: month == 12 ? year + 1 : year, month: month == 12 ? 1 : month + 1, day: 1))!
    }

    /// `YYYY-MM`.
    public var description: String {
        String(repeating: "0", count: max(0, 4 - String(year).count)) + String(year) + (month < 10 ? "-0" : "-") + String(month)
    }

    /// The month's first day, `YYYY-MM-01` (a SQL `date`).
    var firstDay: String { description + "-01" }

    public static func < (lhs: LedgerMonth, rhs: LedgerMonth) -> Bool {
        (lhs.year, lhs.month) < (rhs.year, rhs.month)
    }
}
