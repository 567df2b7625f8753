import Foundation

/// A call's feature as its admission saw it (SPEC §8): the four windows (company and user, day
/// and period), each with what is used after the call and its limit (nil = unlimited), and the
/// one that refused it.
public struct FeatureState: Sendable {
    public enum Window: String, Sendable {
        case day, period
    }
    /// Whose window: the company's or the user's.
    public typealias Scope = Refusal.Scope
    /// Which of the four windows: a scope's day or period.
    public struct Kind: Sendable, Hashable {
        public var scope: Scope
        public var window: Window

        public init(_ scope: Scope, _ window: Window) {
            self.scope = scope
            self.window = window
        }

        /// The order the admission locks the counters in, and the order of their columns.
        static let lockOrder = [Kind(.company, .period), Kind(.company, .day), Kind(.user, .period), Kind(.user, .day)]
    }
    /// One window of one scope.
    public struct Counter: Sendable {
        public var window: Window
        public var scope: Scope
        public var used: Int64
        public var limit: Int64?

        public var kind: Kind { Kind(scope, window) }

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

    /// `values` in the lock order (``Kind/lockOrder``), a window with neither used nor limit left
    /// out; `refused`: the window that refused the call, nil when none did.
    init(
        id: String, name: String, refused: Kind?, message: String?, dayStart: Date?, dayEnd: Date?,
        values: [(used: Int64?, limit: Int64?)]
    ) {
        self.id = id
        self.name = name
        self.dayStart = dayStart
        self.dayEnd = dayEnd
        self.message = message
        counters = zip(Kind.lockOrder, values).compactMap { kind, value in
            guard value.used != nil || value.limit != nil else { return nil }
            return Counter(window: kind.window, scope: kind.scope, used: value.used ?? 0, limit: value.limit)
        }
        if let refused {
            self.refused = counters.first { $0.kind == refused }
        }
    }

    /// When `counter`'s window renews: the next midnight in the company's zone, or the period's end.
    func resetAt(_ counter: Counter, periodEnd: Date?) -> Date? {
        counter.window == .day ? dayEnd : periodEnd
    }
}
