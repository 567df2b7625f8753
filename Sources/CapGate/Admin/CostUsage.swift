import Foundation

/// One cost budget's standing in a period (SPEC §11 "Headers and reads"): what settled calls
/// cost (`used`), what admitted calls not settled yet hold (`held`), the budget (`limit`, nil:
/// unlimited) and what is left of it. Written as decimal strings of US dollars (``Micros``).
public struct CostCounter: Sendable, Equatable {
    public var used: Micros
    public var held: Micros
    /// `nil`: unlimited.
    public var limit: Micros?

    /// Nothing spent, nothing held, no budget.
    public static let unlimited = CostCounter(used: .zero, held: .zero, limit: nil)

    public init(used: Micros, held: Micros, limit: Micros?) {
        self.used = used
        self.held = held
        self.limit = limit
    }

    /// Micro-dollars as the counters store them.
    init(used: Int64, held: Int64, limit: Int64?) {
        self.init(used: Micros(used), held: Micros(held), limit: limit.map(Micros.init))
    }

    /// The admission's counter (``CostState/Counter``), micro-dollars as stored.
    init(_ counter: CostState.Counter) {
        self.init(used: counter.used, held: counter.held, limit: counter.limit)
    }

    /// `limit − used − held`, never below 0 (a provider that bills more than a call's hold can
    /// push `used` past the budget; what is left is then nothing, not a debt); nil when
    /// unlimited. Each step is clamped, so no amount a counter can hold overflows.
    public var remaining: Micros? {
        limit.map { Micros(max(0, max(0, $0.value - used.value) - held.value)) }
    }

    /// `{"used", "held", "limit", "remaining"}`, `null` written for an unlimited budget.
    public var json: JSON {
        .obj([
            "used": .string(used.decimal), "held": .string(held.decimal),
            "limit": limit.map { .string($0.decimal) } ?? .null, "remaining": remaining.map { .string($0.decimal) } ?? .null,
        ])
    }
}

extension CostCounter: Encodable {
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// The `cost` object of the usage reads (SPEC §11): the company's budget and, in
/// `GET /v1/usage`, the caller's. The admin read and the history carry the company's only (each
/// user's is in its entry of `users`), so `user` is then not written at all.
public struct CostUsage: Sendable, Equatable {
    public var company: CostCounter
    /// The caller's budget (its own `monthly_budget`, else the plan's `monthly_user_budget`);
    /// nil where the read is not a user's.
    public var user: CostCounter?

    public static let unlimited = CostUsage(company: .unlimited, user: nil)

    public init(company: CostCounter, user: CostCounter? = nil) {
        self.company = company
        self.user = user
    }

    public var json: JSON {
        var fields: [JSON.Field] = [.init("company", company.json)]
        if let user { fields.append(.init("user", user.json)) }
        return .object(fields)
    }

    /// `usage` (an object) with this as its `cost` (replacing one already there).
    func adding(to usage: JSON) -> JSON {
        guard case .object(var fields) = usage else { return usage }
        fields.removeAll { $0.key == "cost" }
        fields.append(.init("cost", json))
        return .object(fields)
    }
}

extension CostUsage: Encodable {
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// `GET /admin/v1/companies/{id}/usage/models` (SPEC §11): one period's charged calls by
/// model, most costly first (then by model id; calls that named no model last among equals).
public struct PeriodModels: Sendable, Equatable {
    public var start: Date
    public var end: Date
    public var models: [ModelUsage]

    package init(start: Date, end: Date, models: [ModelUsage]) {
        self.start = start
        self.end = end
        self.models = models
    }
}

extension PeriodModels: Encodable {
    enum CodingKeys: String, CodingKey { case period, models }
    enum BoundsKeys: String, CodingKey { case start, end }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        var period = c.nestedContainer(keyedBy: BoundsKeys.self, forKey: .period)
        try period.encode(Timestamp.format(start), forKey: .start)
        try period.encode(Timestamp.format(end), forKey: .end)
        try c.encode(models, forKey: .models)
    }
}

/// One model's calls in a period: their tokens (cache writes 5-minute and 1-hour together), what
/// the settled ones cost (`cost_usd`) and what the unsettled ones hold (`held_usd`).
public struct ModelUsage: Sendable, Equatable {
    /// The request's `model`; nil for calls that named none (routes other than the Messages API).
    public var model: String?
    public var calls: Int64
    public var inputTokens: Int64
    public var outputTokens: Int64
    public var cacheWriteTokens: Int64
    public var cacheReadTokens: Int64
    public var cost: Micros
    public var held: Micros

    package init(
        model: String?, calls: Int64, inputTokens: Int64, outputTokens: Int64, cacheWriteTokens: Int64, cacheReadTokens: Int64,
        cost: Micros, held: Micros
    ) {
        self.model = model
        self.calls = calls
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheWriteTokens = cacheWriteTokens
        self.cacheReadTokens = cacheReadTokens
        self.cost = cost
        self.held = held
    }
}

extension ModelUsage: Encodable {
    enum CodingKeys: String, CodingKey {
        case model, calls, inputTokens = "input_tokens", outputTokens = "output_tokens", cacheWriteTokens = "cache_write_tokens"
        case cacheReadTokens = "cache_read_tokens", cost = "cost_usd", held = "held_usd"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(model, forKey: .model)
        try c.encode(calls, forKey: .calls)
        try c.encode(inputTokens, forKey: .inputTokens)
        try c.encode(outputTokens, forKey: .outputTokens)
        try c.encode(cacheWriteTokens, forKey: .cacheWriteTokens)
        try c.encode(cacheReadTokens, forKey: .cacheReadTokens)
        try c.encode(cost, forKey: .cost)
        try c.encode(held, forKey: .held)
    }
}
