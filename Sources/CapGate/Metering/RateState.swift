import Foundation

/// A call's rate windows (SPEC §14) as its admission saw them: the plan's per-minute limits and
/// the counts of the company's and the user's windows in the call's UTC minute with the user's
/// calls in flight, the same for the call's feature where its entitlement sets limits, and the
/// window that refused it, if one did.
public struct RateState: Sendable, Equatable {
    /// One of the five windows, named as SPEC §14 names them (`usage.rate.window`, RateLimit).
    public enum Window: String, Sendable, CaseIterable {
        case companyRPM = "company-rpm"
        case companyTPM = "company-tpm"
        case userRPM = "user-rpm"
        case userTPM = "user-tpm"
        case userConcurrency = "user-concurrency"

        /// Whose window it is: the company's or the user's.
        var scope: Refusal.Scope { self == .companyRPM || self == .companyTPM ? .company : .user }
    }

    /// The five limits of a plan or an entitlement; nil: none.
    public struct Limits: Sendable, Equatable {
        public var companyRPM: Int64?
        public var companyTPM: Int64?
        public var userRPM: Int64?
        public var userTPM: Int64?
        public var userConcurrency: Int64?

        public init(
            companyRPM: Int64? = nil, companyTPM: Int64? = nil, userRPM: Int64? = nil, userTPM: Int64? = nil,
            userConcurrency: Int64? = nil
        ) {
            self.companyRPM = companyRPM
            self.companyTPM = companyTPM
            self.userRPM = userRPM
            self.userTPM = userTPM
            self.userConcurrency = userConcurrency
        }

        public var isEmpty: Bool { self == Limits() }

        public subscript(window: Window) -> Int64? {
            switch window {
            case .companyRPM: companyRPM
            case .companyTPM: companyTPM
            case .userRPM: userRPM
            case .userTPM: userTPM
            case .userConcurrency: userConcurrency
            }
        }

        /// The windows set, in SPEC §14's order.
        var windows: [Window] { Window.allCases.filter { self[$0] != nil } }
    }

    /// What one owner's windows hold in the minute (nil: that owner has no window set).
    public struct Counts: Sendable, Equatable {
        public var companyCalls: Int64?
        public var companyTokens: Int64?
        public var userCalls: Int64?
        public var userTokens: Int64?
        public var userInFlight: Int64?

        public init(
            companyCalls: Int64? = nil, companyTokens: Int64? = nil, userCalls: Int64? = nil, userTokens: Int64? = nil,
            userInFlight: Int64? = nil
        ) {
            self.companyCalls = companyCalls
            self.companyTokens = companyTokens
            self.userCalls = userCalls
            self.userTokens = userTokens
            self.userInFlight = userInFlight
        }

        public subscript(window: Window) -> Int64? {
            switch window {
            case .companyRPM: companyCalls
            case .companyTPM: companyTokens
            case .userRPM: userCalls
            case .userTPM: userTokens
            case .userConcurrency: userInFlight
            }
        }

        /// The counts after a refund of a call the provider answered with an error: its `tokens`
        /// and its slot leave, the call stays in the call windows (the provider saw it).
        func without(tokens: Int64) -> Counts {
            Counts(
                companyCalls: companyCalls, companyTokens: companyTokens.map { max(0, $0 - tokens) },
                userCalls: userCalls, userTokens: userTokens.map { max(0, $0 - tokens) },
                userInFlight: userInFlight.map { max(0, $0 - 1) })
        }
    }

    /// The windows of the call's feature (its entitlement's limits, counted per feature).
    public struct FeatureWindows: Sendable, Equatable {
        public var id: String
        public var limits: Limits
        public var counts: Counts
    }

    public var limits: Limits
    /// The UTC minute the counts belong to.
    public var minute: Date
    public var counts: Counts
    public var feature: FeatureWindows?
    /// The window that refused the call (429), nil when it fits; `refusedFeature`: it is the
    /// window of the call's feature.
    public var refused: Window?
    public var refusedFeature = false
    /// What the call holds in the token windows (its prompt bound plus `max_tokens`).
    public var tokens: Int64?

    /// The limit of the refusing token window when the call's own hold is over it: such a call
    /// can never be admitted, whatever else runs (SPEC §14: 400, not a 429 the SDKs retry for
    /// ever). Nil for any other refusal.
    public var holdOverRefusingLimit: Int64? {
        guard let refused, refused == .companyTPM || refused == .userTPM, let tokens else { return nil }
        let limits = refusedFeature ? (feature?.limits ?? Limits()) : limits
        guard let limit = limits[refused], tokens > limit else { return nil }
        return limit
    }

    /// When the window has room again: the minute's end, or a second from `now` for the calls in
    /// flight (a slot frees when a call ends, which cannot be foreseen).
    public func resetAt(_ window: Window, now: Date) -> Date {
        window == .userConcurrency ? now.addingTimeInterval(1) : minute.addingTimeInterval(60)
    }

    /// What a charged call's end gives back in its windows.
    public struct End: Sendable, Equatable {
        /// Its concurrency slot (`capgate_rate_end`): the answer ends only after its end is
        /// written, so that a caller who saw the answer end finds the slot free.
        public var slot = false
        /// Its token hold in a token window: traded for the real count by its settlement (not
        /// awaited).
        public var tokens = false

        /// Nothing: no token window, no concurrency limit.
        public static let none = End()
    }

    /// What the call's end gives back in its windows.
    public var end: End {
        guard refused == nil else { return .none }
        let owners = [limits] + (feature.map { [$0.limits] } ?? [])
        return End(
            slot: owners.contains { $0.userConcurrency != nil },
            tokens: owners.contains { $0.companyTPM != nil || $0.userTPM != nil })
    }

    /// The window a call made now would be refused by (`GET /v1/usage/check`, a dry run without a
    /// body): a minute's calls with no room for one more, a token window already full (every
    /// call holds at least one token), every slot taken; nil when each has room. The plan's
    /// windows and the feature's in the admission's order: the company's (the plan's, then the
    /// feature's), then the user's (the plan's, then the feature's); `feature` true when the
    /// refusing window is the feature's.
    func refusalNow() -> (window: Window, feature: Bool)? {
        let companyWindows: [Window] = [.companyRPM, .companyTPM]
        let userWindows: [Window] = [.userRPM, .userTPM, .userConcurrency]
        for windows in [companyWindows, userWindows] {
            if let window = windows.first(where: { Self.full(window: $0, limits: limits, counts: counts) }) {
                return (window, false)
            }
            if let feature, let window = windows.first(where: { Self.full(window: $0, limits: feature.limits, counts: feature.counts) }) {
                return (window, true)
            }
        }
        return nil
    }

    /// Whether `window` has no room for one more call now (a token window: already full).
    private static func full(window: Window, limits: Limits, counts: Counts) -> Bool {
        guard let limit = limits[window] else { return false }
        let used = counts[window] ?? 0
        return window == .companyRPM || window == .userRPM ? used + 1 > limit : used >= limit
    }

    /// The state after a call the provider answered with an error was given back: its tokens
    /// leave its windows and its slot is freed; the call stays counted (SPEC §14).
    func refunded() -> RateState {
        var s = self
        s.counts = counts.without(tokens: tokens ?? 0)
        s.feature?.counts = feature?.counts.without(tokens: tokens ?? 0) ?? Counts()
        return s
    }

    /// `usage.rate` of a 429: the refusing window (with `feature` when it is a feature's).
    func refusalJSON(now: Date) -> JSON {
        guard let refused else { return .null }
        let (limits, counts) = refusedFeature ? (feature?.limits ?? Limits(), feature?.counts ?? Counts()) : (limits, counts)
        var fields: [JSON.Field] = [
            .init("window", .string(refused.rawValue)), .init("limit", JSON(limits[refused])),
            .init("used", .int(counts[refused] ?? 0)), .init("reset_at", JSON(resetAt(refused, now: now))),
        ]
        if refusedFeature, let feature { fields.append(.init("feature", .string(feature.id))) }
        return .object(fields)
    }

    /// The RateLimit entries (SPEC §14): one per window set with a count; a minute window's `w` is
    /// 60 and its `t` the seconds to the minute's end, the calls in flight have no window. A
    /// feature's are named `feature.<id>.<window>`.
    func rateLimitEntries(now: Date) -> (policies: [String], states: [String]) {
        var policies: [String] = []
        var states: [String] = []
        let reset = max(0, Int(minute.addingTimeInterval(60).timeIntervalSince(now).rounded(.up)))
        var owners = [("", limits, counts)]
        if let feature { owners.append(("feature.\(feature.id).", feature.limits, feature.counts)) }
        for (prefix, limits, counts) in owners {
            for window in limits.windows {
                // A refused call's other owners were not read: only the windows with a count.
                guard let limit = limits[window], let used = counts[window] else { continue }
                let name = prefix + window.rawValue
                let remaining = max(0, limit - used)
                if window == .userConcurrency {
                    policies.append("\"\(name)\";q=\(limit)")
                    states.append("\"\(name)\";r=\(remaining)")
                } else {
                    policies.append("\"\(name)\";q=\(limit);w=60")
                    states.append("\"\(name)\";r=\(remaining);t=\(reset)")
                }
            }
        }
        return (policies, states)
    }
}
