/// An amount of US dollars as a whole number of micro-dollars (USD × 10^6): money as SPEC §11
/// wants it, exact integers in storage and decimal strings on the wire, never floating point.
///
/// Text is read exactly and bounded: `^(0|[1-9][0-9]{0,8})(\.[0-9]{1,6})?$`, so `"3"`, `"3.75"`,
/// `"0.000001"` and at most `"999999999.999999"`: no sign, exponent, spaces, leading zeros
/// (`"03"`), bare point (`".5"`, `"5."`) or 7th decimal (refused, never rounded). Any 9,000
/// amounts of this size add up without overflowing `Int64`.
///
/// Text is written in its shortest form: no trailing zeros and no trailing point (`"3.75"`,
/// `"3"`, `"0.000001"`, `"0"`), so a string that is already shortest comes back byte for byte.
public struct Micros: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    /// Micro-dollars.
    public var value: Int64

    /// The largest amount a decimal string may name: 999,999,999.999999 USD.
    public static let max = Micros(999_999_999_999_999)
    public static let zero = Micros(0)
    /// Micro-dollars in one dollar.
    static let perDollar: Int64 = 1_000_000

    public init(_ value: Int64) {
        self.value = value
    }

    /// The amount a decimal string of dollars names exactly; nil for any other text (see the type).
    public init?(decimal text: String) {
        let bytes = Array(text.utf8)
        let point = bytes.firstIndex(of: UInt8(ascii: "."))
        let whole = bytes[..<(point ?? bytes.endIndex)]
        let fraction = point.map { bytes[($0 + 1)...] } ?? []
        func isDigits(_ part: ArraySlice<UInt8>) -> Bool {
            part.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        }
        guard (1...9).contains(whole.count), isDigits(whole), whole.count == 1 || whole.first != UInt8(ascii: "0"),
            point == nil || (1...6).contains(fraction.count), isDigits(fraction)
        else { return nil }
        var micros: Int64 = 0
        for digit in whole { micros = micros * 10 + Int64(digit - UInt8(ascii: "0")) }
        var scale = Self.perDollar
        micros *= scale
        for digit in fraction {
            scale /= 10
            micros += Int64(digit - UInt8(ascii: "0")) * scale
        }
        self.value = micros
    }

    /// The shortest decimal string of dollars (`"3.75"`, `"3"`, `"0.000001"`); a negative amount
    /// (a difference, never stored) starts with `-`.
    public var decimal: String {
        let magnitude = value.magnitude
        let dollars = magnitude / UInt64(Self.perDollar)
        var fraction = magnitude % UInt64(Self.perDollar)
        let sign = value < 0 ? "-" : ""
        guard fraction > 0 else { return sign + String(dollars) }
        var digits = 6
        while fraction % 10 == 0 {
            fraction /= 10
            digits -= 1
        }
        let text = String(fraction)
        return sign + String(dollars) + "." + String(repeating: "0", count: digits - text.count) + text
    }

    public var description: String { decimal }

    public static func < (a: Micros, b: Micros) -> Bool { a.value < b.value }

    /// A decimal string, as the API writes money.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(decimal)
    }

    /// A decimal string as ``init(decimal:)`` reads it; anything else is a decoding error.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        let text = try c.decode(String.self)
        guard let amount = Micros(decimal: text) else {
            throw DecodingError.dataCorruptedError(in: c, debugDescription: "'\(text)' is not a decimal string of US dollars")
        }
        self = amount
    }
}
