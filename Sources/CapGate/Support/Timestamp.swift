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

    /// Parses `2026-11-01T00:00:00Z`, with or without fractional seconds or a numeric offset.
    public static func parse(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601) { return date }
        let withFraction = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        if let date = try? withFraction.parse(text) { return date }
        // A date alone means midnight UTC.
        if text.count == 10, let date = try? Date(text + "T00:00:00Z", strategy: .iso8601) { return date }
        return nil
    }
}
