import Foundation
import HTTPTypes

/// A period's cost counters (SPEC §11) as an admission saw them, in micro-dollars: what the
/// company and the user spent (settled calls), what is held for calls still running, and their
/// budgets; with the call's own hold.
public struct CostState: Sendable, Equatable {
    public struct Counter: Sendable, Equatable {
        public var used: Int64
        public var held: Int64
        /// The budget; nil: unlimited.
        public var limit: Int64?

        public init(used: Int64, held: Int64, limit: Int64?) {
            self.used = used
            self.held = held
            self.limit = limit
        }

        /// limit − used − held, never below zero; nil when unlimited (``CostCounter/remaining``).
        public var remaining: Int64? { CostCounter(self).remaining?.value }

        /// `{"used", "held", "limit", "remaining"}` in decimal strings of dollars, as the usage
        /// reads write a budget (``CostCounter``).
        func fields() -> [JSON.Field] { CostCounter(self).json.objectFields ?? [] }
    }

    public var company: Counter?
    public var user: Counter?
    /// The call's hold; nil: nothing was held (no price, or a call that is not metered).
    public var hold: Int64?

    public init(company: Counter?, user: Counter?, hold: Int64?) {
        self.company = company
        self.user = user
        self.hold = hold
    }

    /// The 402 `budget_exceeded` answer's `usage.cost`: the refusing budget's counter and the
    /// hold that did not fit.
    func refusalJSON(scope: Refusal.Scope) -> JSON {
        let counter = scope == .company ? company : user
        var fields: [JSON.Field] = [.init("scope", .string(scope.rawValue))]
        fields += (counter ?? Counter(used: 0, held: 0, limit: nil)).fields()
        fields.append(.init("hold", JSON(hold.map { Micros($0).decimal })))
        return .object(fields)
    }

    /// The RateLimit entries of the bounded budgets, in micro-dollars (SPEC §11):
    /// `"company-cost"` and `"user-cost"`.
    func rateLimitEntries(window: Int, reset: Int) -> (policies: [String], states: [String]) {
        var policies: [String] = []
        var states: [String] = []
        for (name, counter) in [("company-cost", company), ("user-cost", user)] {
            guard let counter, let limit = counter.limit, let remaining = counter.remaining else { continue }
            policies.append("\"\(name)\";q=\(limit);w=\(window)")
            states.append("\"\(name)\";r=\(remaining);t=\(reset)")
        }
        return (policies, states)
    }

    /// The state after the call's hold was given back.
    func refunded() -> CostState {
        var s = self
        if let hold {
            s.company = company.map { Counter(used: $0.used, held: max(0, $0.held - hold), limit: $0.limit) }
            s.user = user.map { Counter(used: $0.used, held: max(0, $0.held - hold), limit: $0.limit) }
        }
        return s
    }
}
