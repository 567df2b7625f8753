import Foundation
import NIOCore

/// What CapGate reads of a call's body to decide its charge (SPEC §2: what is charged is what
/// the provider reads). A body with a JSON content type is read whole by the strict
/// I-JSON reader (``JSONParser``): a body the provider could read another way (a repeated
/// `requests`, a lone surrogate, `NaN`, nesting past `proxy.maxJSONDepth`, trailing text) is a
/// 400 before admission, so no field is ever taken from a body that did not parse whole. A body
/// of another type (or none) is read the same way when its route counts its items.
struct CallBody: Sendable {
    /// The body as received.
    var raw: ByteBuffer
    /// `proxy.maxJSONDepth`.
    var maxDepth: Int
    /// The top-level members read, or nil when the body was not read as JSON (empty, or not of
    /// a JSON content type, such as `multipart/form-data`).
    var json: JSONParser.TopLevel?

    /// The members built from the body; the rest is only checked (and arrays counted).
    static let members: Set<String> = ["model", "max_tokens"]

    /// Reads `body` when its content type is JSON; anything else is read only if a route needs
    /// it (``items(_:units:)``).
    static func read(_ body: ByteBuffer, contentType: String?, maxDepth: Int) throws -> CallBody {
        var call = CallBody(raw: body, maxDepth: maxDepth, json: nil)
        if body.readableBytes > 0, isJSON(contentType) { call.json = try parse(body, maxDepth: maxDepth) }
        return call
    }

    static func parse(_ body: ByteBuffer, maxDepth: Int) throws -> JSONParser.TopLevel {
        do {
            return try JSONParser.members(members, in: body, maxDepth: maxDepth)
        } catch {
            throw GatewayError.invalidRequest(
                "The request body must be one valid JSON text (I-JSON, RFC 7493): \(error.description). Nothing was charged.")
        }
    }

    /// `application/json` or any `…/json` and `…+json` type: the media type (before any `;`,
    /// without surrounding white space) ends so, in any case.
    static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return false }
        var bytes = contentType.utf8[...]
        // A header that is all ASCII (every real one) is read on its bytes: the same answer as
        // Foundation's trimming and lowercasing below, at a small part of its cost per call.
        guard bytes.allSatisfy({ $0 < 0x80 }) else { return isJSONUnicode(contentType) }
        if let semicolon = bytes.firstIndex(of: UInt8(ascii: ";")) { bytes = bytes[..<semicolon] }
        while let last = bytes.last, last == 0x20 || last == 0x09 { bytes = bytes.dropLast() }
        guard bytes.count >= 5 else { return false }
        let tail = bytes.suffix(5)
        let separator = tail[tail.startIndex]
        guard separator == UInt8(ascii: "/") || separator == UInt8(ascii: "+") else { return false }
        return zip(tail.dropFirst(), "json".utf8).allSatisfy { $0 | 0x20 == $1 }
    }

    /// ``isJSON(_:)`` for a header with non-ASCII bytes: Unicode white space and case.
    static func isJSONUnicode(_ contentType: String) -> Bool {
        let media = contentType.prefix { $0 != ";" }.trimmingCharacters(in: .whitespaces).lowercased()
        return media.hasSuffix("/json") || media.hasSuffix("+json")
    }

    /// The request's `model` as the ledger stores it (a string of the top-level object), if any.
    var model: String? {
        json?.values["model"]?.stringValue.map { Call.ledgerText($0, limit: 200) }
    }

    /// The number of elements of the top-level array `field` (a route's `items_field`). The
    /// route decides the charge from the body, so the body is read as I-JSON whatever content
    /// type it claims (the provider may read it as JSON all the same); 400 when it is not, or
    /// the member is missing, empty or not an array.
    func items(_ field: String, units: Int) throws -> Int {
        let json = try self.json ?? Self.parse(raw, maxDepth: maxDepth)
        guard let count = json.arrayCounts[field], count > 0 else {
            throw GatewayError.invalidRequest(
                "This route costs \(units) unit(s) per element of the body's top-level \"\(field)\" array, which is missing, empty or not an array."
            )
        }
        return count
    }

    /// The request's `max_tokens` when it is a whole number from 0 (what the provider bills
    /// output against); nil when missing or anything else.
    var maxTokens: Int64? {
        guard let value = json?.values["max_tokens"]?.intValue, value >= 0 else { return nil }
        return value
    }

    /// The body's image and document blocks and cache requests (``PromptShape``), read as the
    /// provider reads them; a second pass over the body, made only when a call's cost is bounded.
    /// The body is read whatever its content type claims (the provider may read it as JSON all
    /// the same): a bound never rests on a body CapGate did not read.
    func promptShape() throws -> PromptShape {
        guard raw.readableBytes > 0 else { return PromptShape() }
        do {
            return try JSONParser.shape(in: raw, maxDepth: maxDepth)
        } catch {
            throw GatewayError.invalidRequest(
                "The request body must be one valid JSON text (I-JSON, RFC 7493): \(error.description). Nothing was charged.")
        }
    }
}

/// What the admission needs to hold a call's worst case (SPEC §11 "Hold"), in the terms of
/// `capgate_hold` (db/functions/capgate_hold.sql), which caps it at the model's context window
/// and prices it.
public struct CostBound: Sendable, Equatable {
    /// Which cache writes the body can cause (the rate the prompt is held at).
    public enum Cache: Int16, Sendable {
        case none = 0
        /// Some `cache_control`: five-minute writes.
        case fiveMinutes = 1
        /// Some `cache_control` asking for longer: one-hour writes.
        case oneHour = 2
    }

    /// The most prompt tokens the call can be billed for before the window caps them.
    public enum Prompt: Sendable, Equatable {
        /// At most this many (before the model's context window caps them).
        case tokens(Int64)
        /// A document block: the whole context window.
        case wholeWindow
        /// A body the price book cannot bound (server tools, a batch, a tool type not listed,
        /// a body that is not JSON): held nowhere, refused where a budget applies.
        case cannotBound
    }

    public var prompt: Prompt
    /// The body's `max_tokens`; nil: none.
    public var maxTokens: Int64?
    public var cache: Cache
    /// The larger context window the request enables (``largeWindow`` with the provider's 1M
    /// context beta); nil: the price book's.
    public var window: Int64?
    /// The first provider-defined tool type of the body that `costs.toolOverheadTokens` does not
    /// list (the call then cannot be bounded); named in the 400 where a budget applies.
    public var unknownTool: String? = nil

    /// The context window the provider's `context-1m-…` beta enables.
    public static let largeWindow: Int64 = 1_000_000

    /// A call nothing is known of: held nowhere, refused where a budget applies.
    public static let unbounded = CostBound(prompt: .cannotBound, maxTokens: nil, cache: .none, window: nil)

    public init(prompt: Prompt, maxTokens: Int64?, cache: Cache, window: Int64?) {
        self.prompt = prompt
        self.maxTokens = maxTokens
        self.cache = cache
        self.window = window
    }

    /// The bound of a body of `bodyBytes` bytes and `shape`: a text token is at least one byte,
    /// plus what the provider adds for system text (`costs.promptOverheadTokens`), plus what it
    /// adds for the tools it defines (`toolOverhead`: each provider-defined tool's type, and the
    /// tool-use system prompt, `tool_choice`, once when there are tools), plus `costs.imageTokens`
    /// for each image block; any document block makes it the whole window; a body with MCP
    /// servers, a batch, or a provider-defined tool type `toolOverhead` does not list
    /// (``unknownTool``: a server tool, or a version not yet listed) cannot be bounded.
    init(
        bodyBytes: Int, shape: PromptShape, maxTokens: Int64?, overheadTokens: Int, imageTokens: Int, largeWindow: Bool,
        toolOverhead: [String: Int] = CostSettings.publishedToolOverhead
    ) {
        self.maxTokens = maxTokens
        cache = shape.cachedLong ? .oneHour : shape.cached ? .fiveMinutes : .none
        window = largeWindow ? Self.largeWindow : nil
        var tools = shape.tools > 0 ? toolOverhead["tool_choice"] ?? 0 : 0
        for type in shape.toolTypes {
            if let tokens = toolOverhead[type] { tools += tokens } else if unknownTool == nil { unknownTool = type }
        }
        if !shape.bounded || unknownTool != nil {
            prompt = .cannotBound
        } else if shape.documents > 0 {
            prompt = .wholeWindow
        } else {
            let (images, overflowA) = Int64(imageTokens).multipliedReportingOverflow(by: Int64(shape.images))
            let (sum, overflowB) = Int64(bodyBytes + overheadTokens + tools).addingReportingOverflow(images)
            prompt = overflowA || overflowB ? .wholeWindow : .tokens(sum)
        }
    }

    /// Whether `anthropic-beta` (a comma-separated list, possibly repeated) enables the 1M context window.
    static func enablesLargeWindow(_ betas: [String]) -> Bool {
        betas.contains {
            $0.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).lowercased().hasPrefix("context-1m") }
        }
    }
}
