import Foundation

/// One row of the price book (SPEC §11) as the operator API reads and writes it, read by
/// ``PriceStore``. Rates are USD per million tokens, exact (``Micros``).
public struct PriceRecord: Sendable, Equatable {
    /// An exact model id, or a prefix ending in `*`.
    public var model: String
    /// From when this row prices calls (until a later row of the same model).
    public var effectiveFrom: Date
    /// The largest prompt the model takes, in tokens.
    public var contextWindow: Int32
    public var rates: Rates
    /// The rates for every token of a request whose prompt is over a threshold; nil when none.
    public var longPrompt: LongPrompt?

    /// The five rates, USD per million tokens.
    public struct Rates: Sendable, Equatable {
        public var input: Micros
        public var output: Micros
        public var cacheWrite5m: Micros
        public var cacheWrite1h: Micros
        public var cacheRead: Micros

        public init(input: Micros, output: Micros, cacheWrite5m: Micros, cacheWrite1h: Micros, cacheRead: Micros) {
            self.input = input
            self.output = output
            self.cacheWrite5m = cacheWrite5m
            self.cacheWrite1h = cacheWrite1h
            self.cacheRead = cacheRead
        }
    }

    /// `long_prompt`: a prompt (input + cache writes + cache reads) over `thresholdTokens` puts
    /// every token of the request at these rates.
    public struct LongPrompt: Sendable, Equatable {
        public var thresholdTokens: Int32
        public var rates: Rates

        public init(thresholdTokens: Int32, rates: Rates) {
            self.thresholdTokens = thresholdTokens
            self.rates = rates
        }
    }

    public init(model: String, effectiveFrom: Date, contextWindow: Int32, rates: Rates, longPrompt: LongPrompt?) {
        self.model = model
        self.effectiveFrom = effectiveFrom
        self.contextWindow = contextWindow
        self.rates = rates
        self.longPrompt = longPrompt
    }

    /// The highest rate a book row may hold: 10,000 USD per million tokens (10^10 micro-dollars),
    /// so that tokens × rate for any window stays within `Int64` (see ``maxTokens``).
    public static let maxRate = Micros(10_000_000_000)
    /// The largest context window or threshold: 100,000,000 tokens.
    public static let maxTokens: Int32 = 100_000_000

    /// `effective_from` as the API writes it (`2026-11-01T00:00:00Z`, `…00.250Z` when there are
    /// milliseconds), from integer milliseconds so that a binary fraction never loses one.
    public static func timeText(_ date: Date) -> String {
        let millis = Int64((date.timeIntervalSince1970 * 1000).rounded())
        let (seconds, rest) = millis.quotientAndRemainder(dividingBy: 1000)
        let (whole, fraction) = rest < 0 ? (seconds - 1, rest + 1000) : (seconds, rest)
        let text = Timestamp.format(Date(timeIntervalSince1970: TimeInterval(whole)))
        guard fraction > 0 else { return text }
        let digits = String(fraction)
        return String(text.dropLast()) + "." + String(repeating: "0", count: 3 - digits.count) + digits + "Z"
    }
}

/// `{"prices": [row, …]}`, what `GET` answers and `PUT` takes.
public struct PriceBook: Sendable, Equatable, Codable {
    public var prices: [PriceRecord]

    public init(_ prices: [PriceRecord]) {
        self.prices = prices
    }
}

extension PriceRecord: Codable {
    enum CodingKeys: String, CodingKey {
        case model, effectiveFrom = "effective_from", contextWindow = "context_window", longPrompt = "long_prompt"
    }

    /// Every member always present: no long-prompt tier is `"long_prompt": null`, not a missing
    /// key; the time as ``Timestamp`` writes it, the rates as decimal strings.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(model, forKey: .model)
        try c.encode(Self.timeText(effectiveFrom), forKey: .effectiveFrom)
        try c.encode(Int64(contextWindow), forKey: .contextWindow)
        try rates.encode(to: encoder)
        try c.encode(longPrompt, forKey: .longPrompt)
    }

    /// For clients and tests; the API reads a book with ``PriceBookReader``, which also refuses
    /// unknown members and names the bad row.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let text = try c.decode(String.self, forKey: .effectiveFrom)
        guard let effectiveFrom = Timestamp.parseStrict(text) else {
            throw DecodingError.dataCorruptedError(forKey: .effectiveFrom, in: c, debugDescription: "'\(text)' is not an RFC 3339 time")
        }
        self.init(
            model: try c.decode(String.self, forKey: .model), effectiveFrom: effectiveFrom,
            contextWindow: try c.decode(Int32.self, forKey: .contextWindow), rates: try Rates(from: decoder),
            longPrompt: try c.decodeIfPresent(LongPrompt.self, forKey: .longPrompt))
    }
}

extension PriceRecord.Rates: Codable {
    enum CodingKeys: String, CodingKey {
        case input, output, cacheWrite5m = "cache_write_5m", cacheWrite1h = "cache_write_1h", cacheRead = "cache_read"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(input, forKey: .input)
        try c.encode(output, forKey: .output)
        try c.encode(cacheWrite5m, forKey: .cacheWrite5m)
        try c.encode(cacheWrite1h, forKey: .cacheWrite1h)
        try c.encode(cacheRead, forKey: .cacheRead)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            input: try c.decode(Micros.self, forKey: .input), output: try c.decode(Micros.self, forKey: .output),
            cacheWrite5m: try c.decode(Micros.self, forKey: .cacheWrite5m),
            cacheWrite1h: try c.decode(Micros.self, forKey: .cacheWrite1h), cacheRead: try c.decode(Micros.self, forKey: .cacheRead))
    }
}

extension PriceRecord.LongPrompt: Codable {
    enum CodingKeys: String, CodingKey {
        case thresholdTokens = "threshold_tokens"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(Int64(thresholdTokens), forKey: .thresholdTokens)
        try rates.encode(to: encoder)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(thresholdTokens: try c.decode(Int32.self, forKey: .thresholdTokens), rates: try PriceRecord.Rates(from: decoder))
    }
}
