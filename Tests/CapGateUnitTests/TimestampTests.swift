import Foundation
import Testing

@testable import CapGate

/// RFC 3339 times (Support/Timestamp.swift): the strict reader's calendar (days that exist,
/// leap years, offsets, fractions to the millisecond), the writer, and the log lines' integer
/// formatter checked against the calendar.
@Suite("Timestamps: strict reading, writing, civil dates")
struct TimestampTests {
    static let utc: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }()

    static func logText(_ date: Date) -> String {
        var out: [UInt8] = []
        Timestamp.appendMilliseconds(date, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test("strict: Z or z, T or t, an offset is subtracted (+05:30, -23:59), the instant is the UTC one")
    func strictOffsets() {
        let midnight = Date(timeIntervalSince1970: 1_793_491_200)  // 2026-11-01T00:00:00Z
        for text in [
            "2026-11-01T00:00:00Z", "2026-11-01t00:00:00z", "2026-11-01T05:30:00+05:30", "2026-10-31T00:01:00-23:59",
            "2026-11-01T23:59:00+23:59", "2026-11-01T00:00:00+00:00", "2026-11-01T00:00:00-00:00",
        ] {
            #expect(Timestamp.parseStrict(text) == midnight, "\(text)")
        }
    }

    @Test("strict: a fraction of any length is kept to the nearest millisecond, rounding up from the fourth digit")
    func strictFractions() {
        func at(_ fraction: String) -> Date? { Timestamp.parseStrict("2026-11-01T00:00:00\(fraction)Z") }
        let cases: [(String, String)] = [
            (".1", ".100"), (".12", ".120"), (".1234", ".123"), (".1235", ".124"), (".123456789", ".123"), (".0005", ".001"),
            (".0004999", ""), (".000", ""),
        ]
        for (fraction, millis) in cases {
            #expect(at(fraction) != nil && at(fraction) == at(millis), "\(fraction)")
        }
        #expect(at(".250")?.timeIntervalSince1970 == 1_793_491_200.25)
        #expect(Timestamp.parseStrict("2026-10-31T23:59:59.9995Z") == at(""))
    }

    @Test("strict: days that exist in their month and year (leap rules of 4, 100 and 400), nothing else")
    func strictCalendar() {
        for text in ["2024-02-29T00:00:00Z", "2000-02-29T12:00:00Z", "2026-04-30T00:00:00Z", "2026-12-31T23:59:59Z"] {
            #expect(Timestamp.parseStrict(text) != nil, "\(text)")
        }
        for text in [
            "2023-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-06-31T00:00:00Z",
            "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-32T00:00:00Z",
        ] {
            #expect(Timestamp.parseStrict(text) == nil, "\(text)")
        }
    }

    @Test("strict: no 24:00, no minute 60, no leap second, no offset past 23:59, no date alone or missing zone, nothing after")
    func strictRefusals() {
        for text in [
            "2026-11-01T24:00:00Z", "2026-11-01T23:60:00Z", "2016-12-31T23:59:60Z", "2026-11-01T00:00:00+24:00",
            "2026-11-01T00:00:00+05:60", "2026-11-01T00:00:00+0530", "2026-11-01T00:00:00+05", "2026-11-01", "2026-11-01T00:00:00",
            "2026-11-01T00:00:00.Z", "2026-11-01T00:00:00Z ", " 2026-11-01T00:00:00Z", "2026-11-01 00:00:00Z", "2026-11-01T0:00:00Z",
            "26-11-01T00:00:00Z", "2026-11-01T00:00:00ZZ", "2026-11-01T00:00:00Z+01:00", "２０２６-11-01T00:00:00Z", "",
        ] {
            #expect(Timestamp.parseStrict(text) == nil, "\(text)")
        }
    }

    @Test("writing: whole seconds without a fraction, milliseconds when there is one (cut, not rounded), UTC with Z")
    func format() {
        let midnight = 1_793_491_200.0
        #expect(Timestamp.format(Date(timeIntervalSince1970: midnight)) == "2026-11-01T00:00:00Z")
        #expect(Timestamp.format(Date(timeIntervalSince1970: midnight + 0.25)) == "2026-11-01T00:00:00.250Z")
        #expect(Timestamp.format(Date(timeIntervalSince1970: midnight + 0.000_4)) == "2026-11-01T00:00:00Z")
        #expect(Timestamp.format(Date(timeIntervalSince1970: midnight - 0.000_1)) == "2026-10-31T23:59:59.999Z")
        #expect(Timestamp.format(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00Z")
        #expect(Timestamp.format(Date(timeIntervalSince1970: 951_868_799)) == "2000-02-29T23:59:59Z")
        // What is written reads back strictly to the same instant.
        for text in ["2024-02-29T23:59:59.500Z", "1999-12-31T23:59:59Z", "2038-01-19T03:14:08.125Z"] {
            #expect(Timestamp.format(Timestamp.parseStrict(text)!) == text)
        }
    }

    @Test("log lines: always milliseconds; the integer civil-date formula agrees with the calendar from 1901 to 2099")
    func logTimes() {
        #expect(Self.logText(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00.000Z")
        #expect(Self.logText(Date(timeIntervalSince1970: -0.001)) == "1969-12-31T23:59:59.999Z")
        #expect(Self.logText(Date(timeIntervalSince1970: 951_868_800.5)) == "2000-03-01T00:00:00.500Z")
        var seconds = -2_177_452_800  // 1901-01-01
        while seconds < 4_102_444_800 {  // 2100-01-01
            let date = Date(timeIntervalSince1970: Double(seconds) + 0.5)
            let c = Self.utc.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
            let expected = String(
                format: "%04d-%02d-%02dT%02d:%02d:%02d.500Z", c.year!, c.month!, c.day!, c.hour!, c.minute!, c.second!)
            #expect(Self.logText(date) == expected)
            seconds += 475_193  // about 5.5 days, so every hour and weekday comes round
        }
    }

    @Test("civil days: 1970-01-01 is day 0; month lengths and year lengths agree with the day count over four centuries")
    func civilDays() {
        #expect(Timestamp.daysFromCivil(year: 1970, month: 1, day: 1) == 0)
        #expect(Timestamp.daysFromCivil(year: 1969, month: 12, day: 31) == -1)
        #expect(Timestamp.daysFromCivil(year: 2000, month: 3, day: 1) == 11_017)
        #expect(Timestamp.daysFromCivil(year: 2026, month: 11, day: 1) == 20_758)
        #expect(Timestamp.daysFromCivil(year: 1600, month: 1, day: 1) == -135_140)
        #expect([1900, 2000, 2023, 2024, 2100].map { Timestamp.daysIn(month: 2, year: $0) } == [28, 29, 28, 29, 28])
        for year in 1600...2400 {
            let months = (1...12).map { Timestamp.daysIn(month: $0, year: year) }
            let length = Timestamp.daysFromCivil(year: year + 1, month: 1, day: 1) - Timestamp.daysFromCivil(year: year, month: 1, day: 1)
            #expect(months.reduce(0, +) == length, "\(year)")
            #expect(length == (year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 366 : 365), "\(year)")
        }
    }
}
