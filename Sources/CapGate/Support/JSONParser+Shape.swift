import NIOCore

/// What bounds a Messages call's prompt beyond its bytes (SPEC §11): its image and document
/// blocks, wherever they are nested (a message's content, a tool result's), and whether anything
/// asks to be cached, and for how long.
struct PromptShape: Sendable, Equatable {
    /// Objects whose `type` is `"image"`.
    var images = 0
    /// Objects whose `type` is `"document"` (a PDF, or a file or URL whose size CapGate cannot see).
    var documents = 0
    /// Some object has a `cache_control` member.
    var cached = false
    /// Some `cache_control` asks for longer than five minutes (`"ttl"` other than `"5m"`).
    var cachedLong = false
    /// The call lets the provider add tokens CapGate cannot see: top-level `mcp_servers`. (A
    /// top-level tool of a type the provider defines is judged by its type, ``toolTypes``, against
    /// `costs.toolOverheadTokens`: a server tool such as web search is in no such list.)
    var serverTools = false
    /// Elements of the top-level `tools` array.
    var tools = 0
    /// The `type` of each top-level tool that names one other than `"custom"` (a tool the provider
    /// defines: its definition and any system prompt it adds are not in the body), unescaped.
    var toolTypes: [String] = []
    /// A top-level `requests` member: a Message Batches call, whose cost the price book cannot bound.
    var batch = false
    /// The body asks for a mode the provider bills at a multiple of the model's rates, which the
    /// price book does not hold: `speed` other than `"standard"` (fast mode), `inference_geo`
    /// other than `"global"` (inference kept in one geography).
    var premium = false

    /// Whether the call can be bounded from the body at all (SPEC §11).
    var bounded: Bool { !serverTools && !batch && !premium }

    /// The top-level members whose every value but one (the standard rate's) asks for a premium.
    static let standardModes: [(name: StaticString, standard: String)] = [("speed", "standard"), ("inference_geo", "global")]

}

extension JSONParser {
    /// Checks the whole text as strictly as ``members(_:in:maxDepth:)`` and reads its
    /// ``PromptShape``: names and `type` values are compared after unescaping, so a block's type
    /// is read exactly as the provider reads it (`"typ\u0065": "im\u0061ge"` is an image).
    static func shape(in buffer: ByteBuffer, maxDepth: Int = defaultMaxDepth) throws(Failure) -> PromptShape {
        let result: Result<PromptShape, Failure> = buffer.withUnsafeReadableBytes { raw in
            var parser = JSONParser(raw, maxDepth: maxDepth)
            var shape = PromptShape()
            return Result { () throws(Failure) in
                try parser.shapeValue(depth: 0, into: &shape, place: .body)
                try parser.end()
                return shape
            }
        }
        return try result.get()
    }

    /// Where a value sits, as far as its shape cares.
    enum ShapePlace {
        /// The body itself (the top-level object).
        case body
        /// The top-level `tools` array, or one of its elements.
        case tools, tool
        /// Anywhere else.
        case nested
    }

    /// The value at `i`, checked, with what it adds to `shape`.
    mutating func shapeValue(depth: Int, into shape: inout PromptShape, place: ShapePlace) throws(Failure) {
        skipWhitespace()
        guard i < bytes.count else { throw fail("the JSON text ends where a value should be") }
        switch bytes[i] {
        case Self.openBrace:
            var type: [UInt8]? = nil
            try object(depth: depth + 1, build: false) { (parser: inout JSONParser, name: Name) throws(Failure) in
                parser.skipWhitespace()
                let isString = parser.i < parser.bytes.count && parser.bytes[parser.i] == UInt8(ascii: "\"")
                if isString, parser.nameIs(name, "type") {
                    type = parser.decodedBytes(try parser.string())
                } else if parser.nameIs(name, "cache_control") {
                    shape.cached = true
                    let control = try parser.value(depth: depth + 1, build: true)
                    if let ttl = control["ttl"], ttl.stringValue != "5m" { shape.cachedLong = true }
                } else if place == .body, parser.nameIs(name, "tools") {
                    try parser.shapeValue(depth: depth + 1, into: &shape, place: .tools)
                } else if place == .body, let mode = PromptShape.standardModes.first(where: { parser.nameIs(name, $0.name) }) {
                    if try parser.value(depth: depth + 1, build: true).stringValue != mode.standard { shape.premium = true }
                } else {
                    if place == .body, parser.nameIs(name, "mcp_servers") { shape.serverTools = true }
                    if place == .body, parser.nameIs(name, "requests") { shape.batch = true }
                    try parser.shapeValue(depth: depth + 1, into: &shape, place: .nested)
                }
            }
            if type == Array("image".utf8) { shape.images += 1 }
            if type == Array("document".utf8) { shape.documents += 1 }
            if place == .tool {
                shape.tools += 1
                if let type, type != Array("custom".utf8) { shape.toolTypes.append(String(decoding: type, as: UTF8.self)) }
            }
        case UInt8(ascii: "["):
            _ = try elements(depth: depth + 1) { (parser: inout JSONParser) throws(Failure) in
                try parser.shapeValue(depth: depth + 1, into: &shape, place: place == .tools ? .tool : .nested)
            }
        default:
            _ = try value(depth: depth, build: false)
        }
    }

    /// Whether a member's name is `literal` once unescaped (raw bytes compared when it has no escapes).
    func nameIs(_ name: Name, _ literal: StaticString) -> Bool {
        guard name.escaped else {
            let count = literal.utf8CodeUnitCount
            guard name.end - name.start == count else { return false }
            for k in 0..<count where bytes[name.start + k] != literal.utf8Start[k] { return false }
            return true
        }
        return decodedBytes(name) == Array(UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }
}
