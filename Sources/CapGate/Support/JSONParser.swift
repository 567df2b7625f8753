/// A small, strict JSON parser over bytes (RFC 8259), faster than decoding through `Decodable`
/// for the untyped trees CapGate reads on the hot path (the request's `model`, the provider's
/// `usage`). Object keys keep their order.
struct JSONParser {
    struct Failure: Error {}

    let bytes: [UInt8]
    var i = 0

    init(_ bytes: [UInt8]) {
        self.bytes = bytes
    }

    static func parse(_ bytes: [UInt8]) throws -> JSON {
        var parser = JSONParser(bytes)
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.i == bytes.count else { throw Failure() }
        return value
    }

    mutating func skipWhitespace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }

    /// The values of `keys` in a top-level object, reading no further than needed and building
    /// nothing else (a request body's `model` next to a large prompt); empty when the text is not
    /// an object. Keys the object lacks are absent from the result; a repeated key keeps its first
    /// value.
    static func topLevelValues(_ keys: Set<String>, in bytes: [UInt8]) -> [String: JSON] {
        var found: [String: JSON] = [:]
        scanTopLevel(bytes, wants: { keys.contains($0) && found[$0] == nil }) { name, value in
            found[name] = value
            return found.count < keys.count
        }
        return found
    }

    /// Walks the members of a top-level object in order, building only the values `wants` names
    /// and handing each to `take`, which says whether to read on. Nothing is handed over when the
    /// text is not an object; a text broken off stops the walk where it breaks.
    static func scanTopLevel(_ bytes: [UInt8], wants: (String) -> Bool, take: (String, JSON) -> Bool) {
        var parser = JSONParser(bytes)
        parser.skipWhitespace()
        guard parser.i < bytes.count, bytes[parser.i] == UInt8(ascii: "{") else { return }
        parser.i += 1
        do {
            while true {
                parser.skipWhitespace()
                guard parser.i < bytes.count, bytes[parser.i] == UInt8(ascii: "\"") else { return }
                let name = try parser.string()
                parser.skipWhitespace()
                guard parser.i < bytes.count, bytes[parser.i] == UInt8(ascii: ":") else { return }
                parser.i += 1
                if wants(name) {
                    guard take(name, try parser.value(depth: 1)) else { return }
                } else {
                    _ = try parser.value(depth: 1, build: false)
                }
                parser.skipWhitespace()
                guard parser.i < bytes.count, bytes[parser.i] == UInt8(ascii: ",") else { return }
                parser.i += 1
            }
        } catch {
            return
        }
    }

    /// The value at `i`. With `build` false the value is checked and passed over without
    /// building anything (the result is `.null`).
    mutating func value(depth: Int, build: Bool = true) throws -> JSON {
        guard depth < 512 else { throw Failure() }
        skipWhitespace()
        guard i < bytes.count else { throw Failure() }
        switch bytes[i] {
        case UInt8(ascii: "{"):
            i += 1
            var fields: [JSON.Field] = []
            skipWhitespace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
                i += 1
                return .object(fields)
            }
            while true {
                skipWhitespace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw Failure() }
                let key = build ? try string() : try skipString()
                skipWhitespace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw Failure() }
                i += 1
                let member = try value(depth: depth + 1, build: build)
                if build { fields.append(JSON.Field(key, member)) }
                skipWhitespace()
                guard i < bytes.count else { throw Failure() }
                if bytes[i] == UInt8(ascii: ",") {
                    i += 1
                } else if bytes[i] == UInt8(ascii: "}") {
                    i += 1
                    return .object(fields)
                } else {
                    throw Failure()
                }
            }
        case UInt8(ascii: "["):
            i += 1
            var items: [JSON] = []
            skipWhitespace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
                i += 1
                return .array(items)
            }
            while true {
                let item = try value(depth: depth + 1, build: build)
                if build { items.append(item) }
                skipWhitespace()
                guard i < bytes.count else { throw Failure() }
                if bytes[i] == UInt8(ascii: ",") {
                    i += 1
                } else if bytes[i] == UInt8(ascii: "]") {
                    i += 1
                    return .array(items)
                } else {
                    throw Failure()
                }
            }
        case UInt8(ascii: "\""):
            return build ? .string(try string()) : .string(try skipString())
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        default:
            return try number()
        }
    }

    mutating func literal(_ word: String) throws {
        let expected = Array(word.utf8)
        guard i + expected.count <= bytes.count, bytes[i..<(i + expected.count)].elementsEqual(expected) else { throw Failure() }
        i += expected.count
    }

    mutating func number() throws -> JSON {
        let start = i
        var isInteger = true
        if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard i < bytes.count, (0x30...0x39).contains(bytes[i]) else { throw Failure() }
        if bytes[i] == 0x30 {
            i += 1
        } else {
            while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            isInteger = false
            i += 1
            guard i < bytes.count, (0x30...0x39).contains(bytes[i]) else { throw Failure() }
            while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            isInteger = false
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard i < bytes.count, (0x30...0x39).contains(bytes[i]) else { throw Failure() }
            while i < bytes.count, (0x30...0x39).contains(bytes[i]) { i += 1 }
        }
        let text = String(decoding: bytes[start..<i], as: UTF8.self)
        if isInteger, let int = Int64(text) { return .int(int) }
        guard let double = Double(text) else { throw Failure() }
        return .double(double)
    }

    mutating func string() throws -> String {
        i += 1  // opening quote
        var out: [UInt8] = []
        let start = i
        // Fast path: no escapes.
        while i < bytes.count, bytes[i] != UInt8(ascii: "\""), bytes[i] != UInt8(ascii: "\\") {
            guard bytes[i] >= 0x20 else { throw Failure() }
            i += 1
        }
        guard i < bytes.count else { throw Failure() }
        if bytes[i] == UInt8(ascii: "\"") {
            defer { i += 1 }
            return try validUTF8(bytes[start..<i])
        }
        out.append(contentsOf: bytes[start..<i])
        while i < bytes.count {
            let b = bytes[i]
            if b == UInt8(ascii: "\"") {
                i += 1
                return try validUTF8(out[...])
            }
            if b == UInt8(ascii: "\\") {
                i += 1
                guard i < bytes.count else { throw Failure() }
                switch bytes[i] {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard i + 2 < bytes.count, bytes[i + 1] == UInt8(ascii: "\\"), bytes[i + 2] == UInt8(ascii: "u") else {
                            throw Failure()
                        }
                        i += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw Failure() }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw Failure()
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw Failure() }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default: throw Failure()
                }
                i += 1
            } else {
                guard b >= 0x20 else { throw Failure() }
                out.append(b)
                i += 1
            }
        }
        throw Failure()
    }

    /// Passes over a string (its escapes are not decoded); returns "".
    mutating func skipString() throws -> String {
        i += 1  // opening quote
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "\""):
                i += 1
                return ""
            case UInt8(ascii: "\\"):
                i += 2
            case 0..<0x20:
                throw Failure()
            default:
                i += 1
            }
        }
        throw Failure()
    }

    /// Reads the 4 hex digits after `\u` (leaves `i` on the last digit).
    mutating func hex4() throws -> UInt32 {
        guard i + 4 < bytes.count else { throw Failure() }
        var value: UInt32 = 0
        for k in 1...4 {
            let c = bytes[i + k]
            let digit: UInt32
            switch c {
            case 0x30...0x39: digit = UInt32(c - 0x30)
            case 0x41...0x46: digit = UInt32(c - 0x41 + 10)
            case 0x61...0x66: digit = UInt32(c - 0x61 + 10)
            default: throw Failure()
            }
            value = value << 4 | digit
        }
        i += 4
        return value
    }

    func validUTF8(_ slice: ArraySlice<UInt8>) throws -> String {
        guard let s = String(validating: slice, as: UTF8.self) else { throw Failure() }
        return s
    }
}
