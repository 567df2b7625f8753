import CapGate
import HTTPTypes
import NIOCore

/// The usage the mock provider reports for a Messages call, realistic enough to try cost
/// budgets with (SPEC §11): input from the body (about 4 bytes a token, 1,600 tokens an image),
/// output up to `max_tokens`, and cache fields when the body asks for caching.
///
/// Test controls, as request headers: `x-mock-output-tokens: N` (default 7, never above
/// `max_tokens`), `x-mock-cache-read: N` (cache read tokens, default 0), `x-mock-usage: {…}`
/// (the usage object exactly as given: a provider that bills more than any bound).
struct MockUsage: Sendable {
    var input: Int64
    var output: Int64
    var cacheWrite5m: Int64 = 0
    var cacheWrite1h: Int64 = 0
    var cacheRead: Int64 = 0
    /// `x-mock-usage`, reported instead.
    var verbatim: JSON?

    static let outputField = HTTPField.Name("x-mock-output-tokens")!
    static let cacheReadField = HTTPField.Name("x-mock-cache-read")!
    static let usageField = HTTPField.Name("x-mock-usage")!
    /// What one image costs here (the provider's is about width × height / 750, at most ~1,600).
    static let imageTokens: Int64 = 1_600

    init(input: Int64, output: Int64) {
        self.input = input
        self.output = output
    }

    init(body: ByteBuffer, headers: HTTPFields) {
        let json = try? JSON.parse(body)
        var images: Int64 = 0
        var cache: (asked: Bool, long: Bool) = (false, false)
        if let json { Self.walk(json, images: &images, cache: &cache) }
        let all = Int64(max(1, body.readableBytes / 4)) + images * Self.imageTokens
        let maxTokens = json?["max_tokens"]?.intValue ?? .max
        output = min(headers[Self.outputField].flatMap(Int64.init) ?? MockProvider.outputTokens, maxTokens)
        input = all
        if cache.asked {
            let written = all / 2
            input = all - written
            if cache.long { cacheWrite1h = written } else { cacheWrite5m = written }
        }
        cacheRead = headers[Self.cacheReadField].flatMap(Int64.init) ?? 0
        verbatim = headers[Self.usageField].flatMap { try? JSON.parse(Array($0.utf8)) }
    }

    static func walk(_ value: JSON, images: inout Int64, cache: inout (asked: Bool, long: Bool)) {
        switch value {
        case .object(let fields):
            for field in fields {
                if field.key == "type", field.value.stringValue == "image" { images += 1 }
                if field.key == "cache_control" {
                    cache.asked = true
                    if let ttl = field.value["ttl"], ttl.stringValue != "5m" { cache.long = true }
                }
                walk(field.value, images: &images, cache: &cache)
            }
        case .array(let items):
            for item in items { walk(item, images: &images, cache: &cache) }
        default:
            break
        }
    }

    /// The answer's `usage` object (a stream's `message_start` carries it with `output_tokens` 1).
    func json(output: Int64? = nil) -> JSON {
        if let verbatim { return verbatim }
        var fields: [JSON.Field] = [.init("input_tokens", .int(input))]
        if cacheWrite5m + cacheWrite1h > 0 || cacheRead > 0 {
            fields.append(.init("cache_creation_input_tokens", .int(cacheWrite5m + cacheWrite1h)))
            fields.append(.init("cache_read_input_tokens", .int(cacheRead)))
            fields.append(
                .init(
                    "cache_creation",
                    .obj(["ephemeral_5m_input_tokens": .int(cacheWrite5m), "ephemeral_1h_input_tokens": .int(cacheWrite1h)])))
        }
        fields.append(.init("output_tokens", .int(output ?? self.output)))
        return .object(fields)
    }
}
