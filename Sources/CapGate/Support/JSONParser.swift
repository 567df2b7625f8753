import NIOCore

/// CapGate's one JSON reader: strict I-JSON (RFC 7493) over bytes, for every body CapGate reads
/// (SPEC §2). A text is accepted only when every reader agrees on what it says: valid UTF-8,
/// no duplicate member names at any depth (compared after unescaping), no lone surrogate escapes,
/// only RFC 8259 tokens (no `NaN`, `Infinity`, comments, BOM or single quotes), numbers within
/// the range of a double, nesting at most `maxDepth`, nothing after the value but whitespace.
/// Anything else throws a ``Failure`` that says what is wrong and where; no value is ever taken
/// from a text that did not parse whole.
///
/// It also reads faster than `Decodable` for the untyped trees CapGate needs, and can validate a
/// whole body while building only the top-level members asked for (a request's `model` beside a
/// large prompt) and counting the elements of its top-level arrays (a batch's `requests`).
struct JSONParser {
    /// Why a text is not I-JSON, and the byte offset where that was found.
    struct Failure: Error, CustomStringConvertible, Sendable {
        var reason: String
        var offset: Int
        var description: String { "\(reason) (at byte \(offset))" }
    }

    /// The default deepest nesting (`proxy.maxJSONDepth`).
    static let defaultMaxDepth = 128

    /// What ``members(_:in:maxDepth:)`` reads of a top-level object.
    struct TopLevel: Sendable {
        /// The text is an object (else the other fields are empty).
        var isObject = false
        /// The members asked for, built.
        var values: [String: JSON] = [:]
        /// The element count of every top-level member whose value is an array.
        var arrayCounts: [String: Int] = [:]
    }

    /// A member name seen in the object being read: its raw bytes between the quotes, and
    /// whether they hold escapes (then two names compare by their decoded bytes).
    struct Name {
        var start: Int
        var end: Int
        var escaped: Bool
    }

    /// A member name kept for the repeat check: raw when it has no escapes, else decoded once
    /// (comparing names never decodes one twice, so a body of long escaped names costs its size).
    struct SeenName {
        var name: Name
        var decoded: [UInt8]?
    }

    /// An object's delimiters (named, so that no brace stands unbalanced in a character literal).
    static let openBrace = UInt8(ascii: "\u{7B}")
    static let closeBrace = UInt8(ascii: "\u{7D}")

    /// Above this many members, an object's names are checked for repeats through a hash set.
    static let linearNameLimit = 16

    let bytes: UnsafeRawBufferPointer
    let maxDepth: Int
    var i = 0
    /// The names of every object being read, innermost last (one allocation for the whole text).
    var names: [SeenName] = []

    init(_ bytes: UnsafeRawBufferPointer, maxDepth: Int) {
        self.bytes = bytes
        self.maxDepth = maxDepth
    }

    // MARK: Entry points

    /// The whole text as a tree.
    static func parse(_ bytes: some Collection<UInt8>, maxDepth: Int = defaultMaxDepth) throws(Failure) -> JSON {
        let result: Result<JSON, Failure> = Array(bytes).withUnsafeBytes { raw in
            var parser = JSONParser(raw, maxDepth: maxDepth)
            return Result { () throws(Failure) in try parser.document() }
        }
        return try result.get()
    }

    static func parse(_ buffer: ByteBuffer, maxDepth: Int = defaultMaxDepth) throws(Failure) -> JSON {
        let result: Result<JSON, Failure> = buffer.withUnsafeReadableBytes { raw in
            var parser = JSONParser(raw, maxDepth: maxDepth)
            return Result { () throws(Failure) in try parser.document() }
        }
        return try result.get()
    }

    /// Checks the whole text and returns the top-level members named in `keys` (built) and the
    /// element counts of its top-level arrays, building nothing else.
    static func members(_ keys: Set<String>, in buffer: ByteBuffer, maxDepth: Int = defaultMaxDepth) throws(Failure) -> TopLevel {
        let result: Result<TopLevel, Failure> = buffer.withUnsafeReadableBytes { raw in
            var parser = JSONParser(raw, maxDepth: maxDepth)
            return Result { () throws(Failure) in try parser.topLevel(keys) }
        }
        return try result.get()
    }

    // MARK: Documents

    mutating func document() throws(Failure) -> JSON {
        let value = try value(depth: 0, build: true)
        try end()
        return value
    }

    mutating func end() throws(Failure) {
        skipWhitespace()
        guard i == bytes.count else { throw fail("there is more after the JSON value") }
    }

    mutating func topLevel(_ keys: Set<String>) throws(Failure) -> TopLevel {
        var top = TopLevel()
        skipWhitespace()
        guard i < bytes.count, bytes[i] == Self.openBrace else {
            _ = try value(depth: 0, build: false)
            try end()
            return top
        }
        top.isObject = true
        try object(depth: 1, build: false) { (parser: inout JSONParser, name: Name) throws(Failure) in
            let key = parser.decodedString(name)
            parser.skipWhitespace()
            if keys.contains(key) {
                let value = try parser.value(depth: 1, build: true)
                if case .array(let items) = value { top.arrayCounts[key] = items.count }
                top.values[key] = value
            } else if parser.i < parser.bytes.count, parser.bytes[parser.i] == UInt8(ascii: "[") {
                top.arrayCounts[key] = try parser.array(depth: 2, build: false).count
            } else {
                _ = try parser.value(depth: 1, build: false)
            }
        }
        try end()
        return top
    }

    // MARK: Values

    /// The value at `i`, at nesting `depth` (its containers count from `depth + 1`). With
    /// `build` false it is checked as strictly and passed over; the result is then `.null`.
    mutating func value(depth: Int, build: Bool) throws(Failure) -> JSON {
        skipWhitespace()
        guard i < bytes.count else { throw fail("the JSON text ends where a value should be") }
        switch bytes[i] {
        case Self.openBrace:
            var fields: [JSON.Field] = []
            try object(depth: depth + 1, build: build) { (parser: inout JSONParser, name: Name) throws(Failure) in
                let member = try parser.value(depth: depth + 1, build: build)
                if build { fields.append(JSON.Field(parser.decodedString(name), member)) }
            }
            return build ? .object(fields) : .null
        case UInt8(ascii: "["):
            return try array(depth: depth + 1, build: build).value
        case UInt8(ascii: "\""):
            let name = try string()
            return build ? .string(decodedString(name)) : .null
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try number(build: build)
        default:
            throw fail("a value cannot start with '\(Self.printable(bytes[i]))' (NaN, Infinity, comments and a BOM are not JSON)")
        }
    }

    /// Reads an object opening at `i` (nesting `depth`): for each member, checks that its name
    /// is not repeated and hands it to `member` with `i` after the colon.
    mutating func object(
        depth: Int, build: Bool, member: (inout JSONParser, Name) throws(Failure) -> Void
    ) throws(Failure) {
        guard depth <= maxDepth else { throw fail("the JSON nests deeper than \(maxDepth) levels") }
        i += 1  // {
        let base = names.count
        defer { names.removeSubrange(base...) }
        var hashed: Set<[UInt8]>?
        skipWhitespace()
        if i < bytes.count, bytes[i] == Self.closeBrace {
            i += 1
            return
        }
        while true {
            skipWhitespace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw fail("an object member must start with a quoted name") }
            let nameStart = i
            let name = try string()
            if hashed != nil {
                guard hashed!.insert(decodedBytes(name)).inserted else { throw duplicate(name, at: nameStart) }
            } else {
                let seen = SeenName(name: name, decoded: name.escaped ? decodedBytes(name) : nil)
                for k in base..<names.count where sameName(names[k], seen) { throw duplicate(name, at: nameStart) }
                names.append(seen)
                if names.count - base > Self.linearNameLimit {
                    hashed = Set(names[base...].map { $0.decoded ?? decodedBytes($0.name) })
                }
            }
            skipWhitespace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw fail("a ':' must follow an object member's name") }
            i += 1
            try member(&self, name)
            skipWhitespace()
            guard i < bytes.count else { throw fail("the JSON text ends inside an object") }
            if bytes[i] == UInt8(ascii: ",") {
                i += 1
            } else if bytes[i] == Self.closeBrace {
                i += 1
                return
            } else {
                throw fail("an object's members must be separated by ',' and closed by '}'")
            }
        }
    }

    /// Reads an array opening at `i` (nesting `depth`); its element count, and the array when
    /// `build`.
    mutating func array(depth: Int, build: Bool) throws(Failure) -> (value: JSON, count: Int) {
        var items: [JSON] = []
        let count = try elements(depth: depth) { (parser: inout JSONParser) throws(Failure) in
            let item = try parser.value(depth: depth, build: build)
            if build { items.append(item) }
        }
        return (build ? .array(items) : .null, count)
    }

    /// Reads an array opening at `i` (nesting `depth`), handing each element to `element` with
    /// `i` at its start; returns the element count.
    mutating func elements(depth: Int, element: (inout JSONParser) throws(Failure) -> Void) throws(Failure) -> Int {
        guard depth <= maxDepth else { throw fail("the JSON nests deeper than \(maxDepth) levels") }
        i += 1  // [
        var count = 0
        skipWhitespace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
            i += 1
            return 0
        }
        while true {
            try element(&self)
            count += 1
            skipWhitespace()
            guard i < bytes.count else { throw fail("the JSON text ends inside an array") }
            if bytes[i] == UInt8(ascii: ",") {
                i += 1
            } else if bytes[i] == UInt8(ascii: "]") {
                i += 1
                return count
            } else {
                throw fail("an array's elements must be separated by ',' and closed by ']'")
            }
        }
    }

    mutating func literal(_ word: StaticString) throws(Failure) {
        let count = word.utf8CodeUnitCount
        guard i + count <= bytes.count else { throw fail("unknown literal (only true, false and null)") }
        for k in 0..<count where bytes[i + k] != word.utf8Start[k] {
            throw fail("unknown literal (only true, false and null)")
        }
        i += count
    }

    /// A number as RFC 8259 writes it, whose value a double can hold (`1e400` cannot: readers
    /// disagree on it, so it is refused).
    mutating func number(build: Bool) throws(Failure) -> JSON {
        let start = i
        var isInteger = true
        if bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard i < bytes.count, Self.isDigit(bytes[i]) else { throw fail("a number needs a digit after '-'") }
        if bytes[i] == UInt8(ascii: "0") {
            i += 1
            if i < bytes.count, Self.isDigit(bytes[i]) { throw fail("a number cannot have a leading zero") }
        } else {
            while i < bytes.count, Self.isDigit(bytes[i]) { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            isInteger = false
            i += 1
            guard i < bytes.count, Self.isDigit(bytes[i]) else { throw fail("a number needs a digit after '.'") }
            while i < bytes.count, Self.isDigit(bytes[i]) { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            isInteger = false
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard i < bytes.count, Self.isDigit(bytes[i]) else { throw fail("a number needs a digit in its exponent") }
            while i < bytes.count, Self.isDigit(bytes[i]) { i += 1 }
        }
        // Short integers fit a double by construction; anything else is converted to check it.
        guard build || !isInteger || i - start > 15 else { return .null }
        let text = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self)
        if isInteger, let int = Int64(text) { return build ? .int(int) : .null }
        guard let double = Double(text), double.isFinite else {
            throw Failure(reason: "the number \(text.prefix(40)) is too large for a double", offset: start)
        }
        return build ? .double(double) : .null
    }

    // MARK: Helpers

    mutating func skipWhitespace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }

    func fail(_ reason: String) -> Failure { Failure(reason: reason, offset: i) }

    func duplicate(_ name: Name, at offset: Int) -> Failure {
        let text = decodedString(name)
        let shown = text.count > 40 ? text.prefix(40) + "…" : Substring(text)
        return Failure(reason: "the member name \"\(shown)\" appears twice in one object", offset: offset)
    }

    static func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }

    static func printable(_ b: UInt8) -> String {
        (0x21...0x7E).contains(b) ? String(UnicodeScalar(b)) : "0x" + String(b, radix: 16, uppercase: true)
    }

    static func hex(_ unit: UInt32) -> String {
        let digits = String(unit, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }
}
