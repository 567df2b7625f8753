import NIOCore

/// A call's usage as the provider reported it (SPEC §11 "Settle"): what its cost is settled from.
public struct ProviderUsage: Sendable, Equatable {
    public var inputTokens: Int64?
    public var outputTokens: Int64?
    /// `cache_creation_input_tokens`, split by `cache_creation.ephemeral_1h_input_tokens` where
    /// given (the rest are five-minute writes).
    public var cacheWrite5m: Int64?
    public var cacheWrite1h: Int64?
    public var cacheRead: Int64?
    /// Whether the answer reported its whole usage (a stream: its last `message_delta` came);
    /// when not, the call is charged its hold.
    public var known: Bool

    public init(
        inputTokens: Int64? = nil, outputTokens: Int64? = nil, cacheWrite5m: Int64? = nil, cacheWrite1h: Int64? = nil,
        cacheRead: Int64? = nil, known: Bool = false
    ) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheWrite5m = cacheWrite5m
        self.cacheWrite1h = cacheWrite1h
        self.cacheRead = cacheRead
        self.known = known
    }
}

/// Reads the provider's token counts out of a response body as it streams past, without
/// holding the body: from the JSON `usage` object of a plain answer, or from the SSE
/// `message_start` / `message_delta` events of a streamed one.
public struct UsageCapture: Sendable {
    enum Mode { case json, sse, none }

    let mode: Mode
    var buffer: [UInt8] = []
    var overflow = false
    public private(set) var inputTokens: Int64?
    public private(set) var outputTokens: Int64?
    var cacheCreation: Int64?
    var cache5m: Int64?
    var cache1h: Int64?
    var cacheRead: Int64?
    /// A stream's `message_delta` with its final output count came.
    var sawDelta = false
    static let jsonLimit = 4 << 20
    static let lineLimit = 1 << 20

    public init(contentType: String?) {
        let type = contentType?.lowercased() ?? ""
        if type.hasPrefix("text/event-stream") {
            mode = .sse
        } else if type.contains("json") {
            mode = .json
        } else {
            mode = .none
        }
    }

    public mutating func feed(_ chunk: ByteBuffer) {
        switch mode {
        case .none:
            return
        case .json:
            guard !overflow else { return }
            if buffer.count + chunk.readableBytes > Self.jsonLimit {
                overflow = true
                buffer = []
                return
            }
            buffer.append(contentsOf: chunk.readableBytesView)
        case .sse:
            for byte in chunk.readableBytesView {
                if byte == UInt8(ascii: "\n") {
                    if !overflow { line(buffer) }
                    buffer.removeAll(keepingCapacity: true)
                    overflow = false
                } else if buffer.count < Self.lineLimit {
                    buffer.append(byte)
                } else {
                    overflow = true
                }
            }
        }
    }

    /// Reads a whole body at once.
    public mutating func read(whole body: ByteBuffer) {
        if mode == .json {
            if body.readableBytes <= Self.jsonLimit, let json = try? JSON.parse(body) { take(json["usage"]) }
            return
        }
        feed(body)
        finish()
    }

    /// Call when the body ended.
    public mutating func finish() {
        switch mode {
        case .json:
            if !overflow, let json = try? JSON.parse(buffer) { take(json["usage"]) }
            buffer = []
        case .sse:
            if !overflow && !buffer.isEmpty { line(buffer) }
            buffer = []
        case .none:
            break
        }
    }

    mutating func line(_ bytes: [UInt8]) {
        // `data: {...}` lines that mention usage; everything else passes untouched.
        guard bytes.count > 5, bytes.starts(with: Array("data:".utf8)) else { return }
        let payload = bytes.dropFirst(5)
        guard Self.contains(payload, Array("\"usage\"".utf8)), let json = try? JSON.parse(payload) else { return }
        if let message = json["message"] { take(message["usage"]) }
        take(json["usage"])
        if json["type"]?.stringValue == "message_delta", json["usage"]?["output_tokens"]?.intValue != nil { sawDelta = true }
    }

    mutating func take(_ usage: JSON?) {
        guard let usage else { return }
        func count(_ value: JSON?) -> Int64? { value?.intValue.flatMap { $0 >= 0 ? $0 : nil } }
        if let input = count(usage["input_tokens"]) { inputTokens = input }
        if let output = count(usage["output_tokens"]) { outputTokens = output }
        if let created = count(usage["cache_creation_input_tokens"]) { cacheCreation = created }
        if let read = count(usage["cache_read_input_tokens"]) { cacheRead = read }
        if let split = usage["cache_creation"] {
            if let short = count(split["ephemeral_5m_input_tokens"]) { cache5m = short }
            if let long = count(split["ephemeral_1h_input_tokens"]) { cache1h = long }
        }
    }

    /// The usage read so far (call after ``finish()``): known when the answer reported its input
    /// and output counts, and for a stream its closing `message_delta` came.
    public var usage: ProviderUsage {
        let long = cache1h ?? 0
        let created = cacheCreation ?? (cache5m ?? 0) + long
        return ProviderUsage(
            inputTokens: inputTokens, outputTokens: outputTokens, cacheWrite5m: max(0, created - long), cacheWrite1h: long,
            cacheRead: cacheRead ?? 0,
            known: inputTokens != nil && outputTokens != nil && (mode != .sse || sawDelta))
    }

    static func contains(_ haystack: ArraySlice<UInt8>, _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        var i = haystack.startIndex
        let last = haystack.endIndex - needle.count
        while i <= last {
            if haystack[i] == needle[0] && haystack[i..<(i + needle.count)].elementsEqual(needle) { return true }
            i += 1
        }
        return false
    }
}
