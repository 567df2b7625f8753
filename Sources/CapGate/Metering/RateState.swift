import Foundation

/// A call's rate windows (SPEC §14) as its admission saw them: the plan's per-minute limits, the
/// counts of the company's and the user's window in the call's UTC minute, the user's calls in
/// flight, and the window that refused it, if one did.
public struct RateState: Sendable, Equatable {
    /// One of the five windows, named as SPEC §14 names them (`usage.rate.window`, RateLimit).
    public enum Window: String, Sendable, CaseIterable {
        case companyRPM = "company-rpm"
        case companyTPM = "company-tpm"
        case userRPM = "user-rpm"
        case userTPM = "user-tpm"
        case userConcurrency = "user-concurrency"
    }

    /// The plan's limits; nil: none.
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
    }

    public var limits: Limits
    /// The UTC minute the counts belong to.
    public var minute: Date
    public var companyCalls: Int64?
    public var companyTokens: Int64?
    public var userCalls: Int64?
    public var userTokens: Int64?
    public var userInFlight: Int64?
    /// The window that refused the call (429), nil when it fits.
    public var refused: Window?
    /// What the call holds in the token windows (its prompt bound plus `max_tokens`).
    public var tokens: Int64?

    /// A window's count, as the admission left it.
    public func used(_ window: Window) -> Int64? {
        switch window {
        case .companyRPM: companyCalls
        case .companyTPM: companyTokens
        case .userRPM: userCalls
        case .userTPM: userTokens
        case .userConcurrency: userInFlight
        }
    }

    /// When the window has room again: the minute's end, or a second from `now` for the calls in
    /// flight (a slot frees when a call ends, which cannot be foreseen).
    public func resetAt(_ window: Window, now: Date) -> Date {
        window == .userConcurrency ? now.addingTimeInterval(1) : minute.addingTimeInterval(60)
    }

    /// The windows the plan sets, in SPEC §14's order.
    public var windows: [Window] { Window.allCases.filter { limits[$0] != nil } }

    /// The call holds a concurrency slot or a token hold that its end gives back
    /// (`capgate_rate_end`): its answer ends only after that is written.
    public var endsInWindows: Bool {
        refused == nil && (limits.userConcurrency != nil || limits.companyTPM != nil || limits.userTPM != nil)
    }

    /// The state after the call was given back: it leaves its windows and frees its slot.
    func refunded() -> RateState {
        var s = self
        let tokens = tokens ?? 0
        s.companyCalls = companyCalls.map { max(0, $0 - 1) }
        s.companyTokens = companyTokens.map { max(0, $0 - tokens) }
        s.userCalls = userCalls.map { max(0, $0 - 1) }
        s.userTokens = userTokens.map { max(0, $0 - tokens) }
        s.userInFlight = userInFlight.map { max(0, $0 - 1) }
        return s
    }

    /// `usage.rate` of a 429: the refusing window.
    func refusalJSON(now: Date) -> JSON {
        guard let refused else { return .null }
        return Self.windowJSON(refused, limit: limits[refused], used: used(refused), resetAt: resetAt(refused, now: now))
    }

    static func windowJSON(_ window: Window, limit: Int64?, used: Int64?, resetAt: Date) -> JSON {
        .obj(["window": .string(window.rawValue), "limit": JSON(limit), "used": .int(used ?? 0), "reset_at": JSON(resetAt)])
    }

    /// The RateLimit entries (SPEC §14): one per window the plan sets; a minute window's `w` is
    /// 60 and its `t` the seconds to the minute's end, the calls in flight have no window.
    func rateLimitEntries(now: Date) -> (policies: [String], states: [String]) {
        var policies: [String] = []
        var states: [String] = []
        let reset = max(0, Int(minute.addingTimeInterval(60).timeIntervalSince(now).rounded(.up)))
        for window in windows {
            // A refused call's other owner was not read: only the windows with a count.
            guard let limit = limits[window], let used = used(window) else { continue }
            let remaining = max(0, limit - used)
            if window == .userConcurrency {
                policies.append("\"\(window.rawValue)\";q=\(limit)")
                states.append("\"\(window.rawValue)\";r=\(remaining)")
            } else {
                policies.append("\"\(window.rawValue)\";q=\(limit);w=60")
                states.append("\"\(window.rawValue)\";r=\(remaining);t=\(reset)")
            }
        }
        return (policies, states)
    }
}
