import NIOCore

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
    }

    mutating func take(_ usage: JSON?) {
        guard let usage else { return }
        if let input = usage["input_tokens"]?.intValue { inputTokens = input }
        if let output = usage["output_tokens"]?.intValue { outputTokens = output }
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
