import Foundation

extension Timestamp {
    /// An RFC 3339 date-time read strictly, with integer arithmetic: `YYYY-MM-DDTHH:MM:SS`, an
    /// optional fraction, then `Z` or `±HH:MM`; a day that exists in its month, hours 0–23,
    /// minutes and seconds 0–59 (no leap second). Fractions are kept to the nearest millisecond.
    /// Nil for anything else, where ``parse(_:)`` (Foundation's reader) accepts `12:99:00` as
    /// `13:39:00` and a date alone.
    public static func parseStrict(_ text: String) -> Date? {
        let b = Array(text.utf8)
        func number(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= b.count else { return nil }
            var value = 0
            for i in range {
                guard b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") else { return nil }
                value = value * 10 + Int(b[i] - UInt8(ascii: "0"))
            }
            return value
        }
        func byte(_ i: Int, _ allowed: String) -> Bool { i < b.count && allowed.utf8.contains(b[i]) }
        guard let year = number(0..<4), byte(4, "-"), let month = number(5..<7), byte(7, "-"), let day = number(8..<10),
            byte(10, "Tt"), let hour = number(11..<13), byte(13, ":"), let minute = number(14..<16), byte(16, ":"),
            let second = number(17..<19), (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day),
            hour <= 23, minute <= 59, second <= 59
        else { return nil }
        var i = 19
        var millis = 0
        if byte(i, ".") {
            i += 1
            let start = i
            while i < b.count, b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") { i += 1 }
            guard i > start else { return nil }
            let digits = (b[start..<min(i, start + 4)].map { Int($0 - UInt8(ascii: "0")) } + [0, 0, 0, 0]).prefix(4)
            millis = digits[0] * 100 + digits[1] * 10 + digits[2] + (digits[3] >= 5 ? 1 : 0)
        }
        var offset = 0
        if byte(i, "Zz"), i + 1 == b.count {
            offset = 0
        } else if byte(i, "+-"), i + 6 == b.count, let hours = number((i + 1)..<(i + 3)), byte(i + 3, ":"),
            let minutes = number((i + 4)..<(i + 6)), hours <= 23, minutes <= 59
        {
            offset = (hours * 60 + minutes) * 60 * (b[i] == UInt8(ascii: "-") ? -1 : 1)
        } else {
            return nil
        }
        let seconds = Int64(daysFromCivil(year: year, month: month, day: day)) * 86_400 + Int64(hour * 3600 + minute * 60 + second - offset)
        return Date(timeIntervalSince1970: Double(seconds * 1000 + Int64(millis)) / 1000)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }
}
