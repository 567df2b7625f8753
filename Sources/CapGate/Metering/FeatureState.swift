import Foundation

/// A call's feature as its admission saw it (SPEC §8): the four windows (company and user, day
/// and period), each with what is used after the call and its limit (nil = unlimited), and the
/// one that refused it.
public struct FeatureState: Sendable {
    public enum Window: String, Sendable {
        case day, period
    }
    public enum Scope: String, Sendable {
        case company, user
    }
    /// One window of one scope.
    public struct Counter: Sendable {
        public var window: Window
        public var scope: Scope
        public var used: Int64
        public var limit: Int64?

        /// The RateLimit policy name, e.g. `feature.analysis.user-day`.
        func policy(feature: String) -> String {
            "feature.\(feature).\(scope == .user ? "user-" : "")\(window.rawValue)"
        }
    }

    public var id: String
    public var name: String
    public var dayStart: Date?
    public var dayEnd: Date?
    /// Company period, company day, user period, user day (the lock order).
    public var counters: [Counter]
    public var refused: Counter?
    /// The entitlement's own text for a refusal, when the operator set one.
    public var message: String?
    /// The limit of the refused window in the plan ``UsageState/upgrade`` names (nil: unlimited there).
    public var upgradeLimit: Int64?

    /// From the `feature_*`, `day_*`, `fc_*` and `fu_*` columns of a `capgate_admitted` row.
    init?(
        id: String?, name: String?, refused: String?, message: String?, dayStart: Date?, dayEnd: Date?,
        values: [(used: Int64?, limit: Int64?)]
    ) {
        guard let id else { return nil }
        self.init(id: id, name: name ?? id, refused: refused, message: message, dayStart: dayStart, dayEnd: dayEnd, values: values)
    }

    /// `values` in the lock order (company period, company day, user period, user day), a window
    /// with neither used nor limit left out; `refused` as `<scope>.<window>` (`company.day`, …).
    init(
        id: String, name: String, refused: String?, message: String?, dayStart: Date?, dayEnd: Date?,
        values: [(used: Int64?, limit: Int64?)]
    ) {
        self.id = id
        self.name = name
        self.dayStart = dayStart
        self.dayEnd = dayEnd
        self.message = message
        let kinds: [(Window, Scope)] = [(.period, .company), (.day, .company), (.period, .user), (.day, .user)]
        counters = zip(kinds, values).compactMap { kind, value in
            guard value.used != nil || value.limit != nil else { return nil }
            return Counter(window: kind.0, scope: kind.1, used: value.used ?? 0, limit: value.limit)
        }
        if let refused {
            let parts = refused.split(separator: ".")
            if parts.count == 2, let scope = Scope(rawValue: String(parts[0])), let window = Window(rawValue: String(parts[1])) {
                self.refused = counters.first { $0.scope == scope && $0.window == window }
            }
        }
    }

    /// When `counter`'s window renews: the next midnight in the company's zone, or the period's end.
    func resetAt(_ counter: Counter, periodEnd: Date?) -> Date? {
        counter.window == .day ? dayEnd : periodEnd
    }
}
