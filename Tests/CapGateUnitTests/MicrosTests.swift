import Foundation
import Testing

@testable import CapGate

/// Money as SPEC §11 wants it: decimal strings read exactly into integer micro-dollars, refused
/// rather than rounded, and written back in their shortest form.
@Suite("Micros: exact decimal strings of US dollars")
struct MicrosTests {
    @Test("reads whole dollars, cents and single micro-dollars exactly")
    func reads() {
        let cases: [(String, Int64)] = [
            ("0", 0), ("3", 3_000_000), ("3.75", 3_750_000), ("0.000001", 1), ("0.1", 100_000), ("22.5", 22_500_000),
            ("1.000000", 1_000_000), ("18.75", 18_750_000), ("999999999.999999", 999_999_999_999_999), ("10", 10_000_000),
        ]
        for (text, micros) in cases {
            #expect(Micros(decimal: text)?.value == micros, "\(text)")
        }
    }

    @Test("refuses a sign, an exponent, spaces, a 7th decimal, leading zeros, a bare point and anything too large")
    func refuses() {
        for text in [
            "", "-1", "+1", "1e3", "1E3", " 1", "1 ", "1,5", "0.0000001", "3.7500000", "03", "00", ".5", "5.", ".", "1.2.3",
            "1000000000", "9999999999.99", "９", "0x10", "NaN", "inf", "1_000", "١",
        ] {
            #expect(Micros(decimal: text) == nil, "\(text)")
        }
    }

    @Test("writes the shortest decimal string: no trailing zeros or point")
    func writes() {
        let cases: [(Int64, String)] = [
            (0, "0"), (1, "0.000001"), (12_345, "0.012345"), (3_750_000, "3.75"), (3_000_000, "3"), (100_000, "0.1"),
            (1_500_000, "1.5"), (999_999_999_999_999, "999999999.999999"), (-12_345, "-0.012345"), (10_000_001, "10.000001"),
        ]
        for (micros, text) in cases {
            #expect(Micros(micros).decimal == text, "\(micros)")
        }
    }

    @Test("every shortest string reads back to itself; every amount survives text and back")
    func roundTrips() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let micros = Int64.random(in: 0...Micros.max.value, using: &generator)
            let text = Micros(micros).decimal
            #expect(Micros(decimal: text)?.value == micros, "\(text)")
            #expect(Micros(decimal: text)?.decimal == text)
        }
        // 9,000 of the largest amounts add up without overflow.
        let (sum, overflow) = Micros.max.value.multipliedReportingOverflow(by: 9000)
        #expect(!overflow && sum > 0)
    }

    @Test("encodes as a JSON string and decodes only a valid one")
    func codable() throws {
        #expect(String(decoding: try wireJSON([Micros(3_750_000)]), as: UTF8.self) == #"["3.75"]"#)
        #expect(try JSONDecoder().decode([Micros].self, from: Data(#"["0.000001"]"#.utf8)) == [Micros(1)])
        #expect(throws: DecodingError.self) { try JSONDecoder().decode([Micros].self, from: Data(#"["1e3"]"#.utf8)) }
        #expect(throws: DecodingError.self) { try JSONDecoder().decode([Micros].self, from: Data("[3.75]".utf8)) }
    }
}
