/// The reader's strings: each checked once as it is passed (UTF-8, escapes, surrogate pairs),
/// decoded only when a value is built or a member name has to be compared.
extension JSONParser {
    // MARK: Strings

    /// Checks the string opening at `i` (valid UTF-8, no control characters, known escapes,
    /// surrogate escapes in pairs) and leaves `i` after its closing quote.
    mutating func string() throws(Failure) -> Name {
        i += 1  // opening quote
        let start = i
        var escaped = false
        while i < bytes.count {
            let b = bytes[i]
            if b == UInt8(ascii: "\"") {
                defer { i += 1 }
                return Name(start: start, end: i, escaped: escaped)
            } else if b == UInt8(ascii: "\\") {
                escaped = true
                try escape()
            } else if b < 0x20 {
                throw fail("a string holds a raw control character (U+00\(String(b, radix: 16, uppercase: true))); escape it")
            } else if b < 0x80 {
                i += 1
            } else {
                try utf8Sequence()
            }
        }
        throw fail("the JSON text ends inside a string")
    }

    /// One escape at `i` (the backslash); leaves `i` after it.
    mutating func escape() throws(Failure) {
        guard i + 1 < bytes.count else { throw fail("the JSON text ends inside a string") }
        switch bytes[i + 1] {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
            UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
            i += 2
        case UInt8(ascii: "u"):
            let unit = try hex4(at: i + 2)
            if (0xDC00...0xDFFF).contains(unit) { throw fail("a string holds a lone low surrogate escape (\\u\(Self.hex(unit)))") }
            if (0xD800...0xDBFF).contains(unit) {
                guard i + 7 < bytes.count, bytes[i + 6] == UInt8(ascii: "\\"), bytes[i + 7] == UInt8(ascii: "u"),
                    (0xDC00...0xDFFF).contains(try hex4(at: i + 8))
                else { throw fail("a string holds a lone high surrogate escape (\\u\(Self.hex(unit)))") }
                i += 12
            } else {
                i += 6
            }
        default:
            throw fail("a string holds an unknown escape '\\\(Self.printable(bytes[i + 1]))'")
        }
    }

    /// The 4 hex digits at `at`.
    func hex4(at: Int) throws(Failure) -> UInt32 {
        guard at + 4 <= bytes.count else { throw fail("a \\u escape needs 4 hex digits") }
        var value: UInt32 = 0
        for k in 0..<4 {
            let c = bytes[at + k]
            let digit: UInt32
            switch c {
            case 0x30...0x39: digit = UInt32(c - 0x30)
            case 0x41...0x46: digit = UInt32(c - 0x41 + 10)
            case 0x61...0x66: digit = UInt32(c - 0x61 + 10)
            default: throw fail("a \\u escape needs 4 hex digits")
            }
            value = value << 4 | digit
        }
        return value
    }

    /// One multi-byte UTF-8 sequence at `i` (RFC 3629: no overlong forms, no surrogates, nothing
    /// past U+10FFFF); leaves `i` after it.
    mutating func utf8Sequence() throws(Failure) {
        let lead = bytes[i]
        let length: Int
        var low: UInt8 = 0x80
        var high: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0:
            length = 3
            low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED:
            length = 3
            high = 0x9F
        case 0xF0:
            length = 4
            low = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4:
            length = 4
            high = 0x8F
        default: throw fail("the body is not valid UTF-8")
        }
        guard i + length <= bytes.count, (low...high).contains(bytes[i + 1]) else { throw fail("the body is not valid UTF-8") }
        for k in 2..<max(2, length) where !(0x80...0xBF).contains(bytes[i + k]) {
            throw fail("the body is not valid UTF-8")
        }
        i += length
    }

    /// The decoded bytes of a checked string.
    func decodedBytes(_ name: Name) -> [UInt8] {
        let raw = UnsafeRawBufferPointer(rebasing: bytes[name.start..<name.end])
        guard name.escaped else { return Array(raw) }
        var out: [UInt8] = []
        out.reserveCapacity(raw.count)
        var k = name.start
        while k < name.end {
            let b = bytes[k]
            guard b == UInt8(ascii: "\\") else {
                out.append(b)
                k += 1
                continue
            }
            switch bytes[k + 1] {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                // Checked by `escape()`: a high surrogate is followed by its low one.
                var scalar = (try? hex4(at: k + 2)) ?? 0xFFFD
                if (0xD800...0xDBFF).contains(scalar) {
                    let low = (try? hex4(at: k + 8)) ?? 0xDC00
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    k += 6
                }
                out.append(contentsOf: String(Character(Unicode.Scalar(scalar) ?? "\u{FFFD}")).utf8)
                k += 6
                continue
            default: out.append(bytes[k + 1])  // " \ /
            }
            k += 2
        }
        return out
    }

    func decodedString(_ name: Name) -> String {
        if !name.escaped { return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[name.start..<name.end]), as: UTF8.self) }
        return String(decoding: decodedBytes(name), as: UTF8.self)
    }

    func sameName(_ a: SeenName, _ b: SeenName) -> Bool {
        func raw(_ name: Name) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: bytes[name.start..<name.end]) }
        switch (a.decoded, b.decoded) {
        case (nil, nil):
            guard a.name.end - a.name.start == b.name.end - b.name.start else { return false }
            return raw(a.name).elementsEqual(raw(b.name))
        case (let x?, let y?):
            return x == y
        case (let x?, nil):
            return x.count == b.name.end - b.name.start && raw(b.name).elementsEqual(x)
        case (nil, let y?):
            return y.count == a.name.end - a.name.start && raw(a.name).elementsEqual(y)
        }
    }
}
