import Foundation

/// RFC 3339 timestamps in UTC, the only time format CapGate reads and writes.
public enum Timestamp {
    /// `2026-11-01T00:00:00Z`; fractional seconds are written only when present.
    public static func format(_ date: Date) -> String {
        let seconds = date.timeIntervalSince1970
        let whole = seconds.rounded(.down)
        let text = Date(timeIntervalSince1970: whole).formatted(.iso8601)
        let fraction = seconds - whole
        guard fraction >= 0.000_5 else { return text }
        let millis = Int((fraction * 1000).rounded(.down))
        return String(text.dropLast()) + "." + String(format: "%03d", millis) + "Z"
    }

    /// Appends `2026-11-23T03:31:37.276Z` (always with milliseconds) as bytes: integer arithmetic
    /// instead of Foundation's formatter, for log lines.
    static func appendMilliseconds(_ date: Date, to out: inout [UInt8]) {
        let micros = (date.timeIntervalSince1970 * 1_000_000).rounded()
        guard micros > -62_135_596_800_000_000, micros < 253_402_300_800_000_000 else {
            return out.append(contentsOf: format(date).utf8)  // outside years 1...9999
        }
        let millis = Int64(micros) / 1000 - (Int64(micros) % 1000 < 0 ? 1 : 0)
        let (days, dayMillis) = millis.quotientAndRemainder(dividingBy: 86_400_000)
        let (day, ms) = dayMillis < 0 ? (days - 1, dayMillis + 86_400_000) : (days, dayMillis)
        // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
        let z = day + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let dayOfMonth = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func digits(_ value: Int64, _ count: Int) {
            var divisor: Int64 = 1
            for _ in 1..<count { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                out.append(UInt8(ascii: "0") + UInt8(rest / divisor))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(year, 4)
        out.append(UInt8(ascii: "-"))
        digits(month, 2)
        out.append(UInt8(ascii: "-"))
        digits(dayOfMonth, 2)
        out.append(UInt8(ascii: "T"))
        digits(ms / 3_600_000, 2)
        out.append(UInt8(ascii: ":"))
        digits(ms / 60_000 % 60, 2)
        out.append(UInt8(ascii: ":"))
        digits(ms / 1000 % 60, 2)
        out.append(UInt8(ascii: "."))
        digits(ms % 1000, 3)
        out.append(UInt8(ascii: "Z"))
    }

    /// Parses `2026-11-01T00:00:00Z`, with or without fractional seconds or a numeric offset.
    public static func parse(_ text: String) -> Date? {
        // A numeric offset is read here: Foundation refuses offsets beyond ±18:00, which RFC 3339
        // allows (up to ±23:59), and reads malformed ones such as +02:60 leniently.
        var bytes = Array(text.utf8)
        guard let t = bytes.firstIndex(where: { $0 == UInt8(ascii: "T") || $0 == UInt8(ascii: "t") }) else {
            return parseUTC(text)
        }
        bytes[t] = UInt8(ascii: "T")  // RFC 3339 allows a lowercase t; Foundation does not
        guard let sign = bytes[t...].firstIndex(where: { $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "-") }) else {
            return parseUTC(String(decoding: bytes, as: UTF8.self))
        }
        let offset = bytes[sign...]
        func digits(_ range: Range<Int>) -> Int? {
            let part = offset.dropFirst(range.lowerBound).prefix(range.count)
            guard part.count == range.count, part.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
            return Int(String(decoding: part, as: UTF8.self))
        }
        guard offset.count == 6, offset[sign + 3] == UInt8(ascii: ":"), let hours = digits(1..<3), let minutes = digits(4..<6),
            bytes[sign - 1] | 0x20 != UInt8(ascii: "z"),  // Z and an offset
            hours <= 23, minutes <= 59, let utc = parseUTC(String(decoding: bytes[..<sign], as: UTF8.self) + "Z")
        else {
            return nil
        }
        let seconds = TimeInterval((hours * 60 + minutes) * 60)
        return bytes[sign] == UInt8(ascii: "+") ? utc - seconds : utc + seconds
    }

    private static func parseUTC(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601) { return date }
        let withFraction = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        if let date = try? withFraction.parse(text) { return date }
        // A date alone means midnight UTC.
        if text.count == 10, let date = try? Date(text + "T00:00:00Z", strategy: .iso8601) { return date }
        return nil
    }
}
