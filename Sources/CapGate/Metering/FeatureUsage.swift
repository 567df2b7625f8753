import Foundation

/// One feature of a company's plan as the usage reads show it (SPEC §8): the entitlement and
/// what is used in its four windows at one instant. Read by ``UsageStore/features(company:user:at:)``.
///
/// A missing counter row is 0 used. An entitlement with `enabled: false` admits nothing, so every
/// window of it shows `limit` 0 and `remaining` 0 (as the `feature_not_in_plan` refusal does).
public struct FeatureUsage: Sendable {
    /// What one user has used of the feature, today and in the period.
    public struct Used: Sendable, Equatable {
        public var day: Int64
        public var period: Int64
    }

    public var id: String
    public var name: String
    public var enabled: Bool
    public var dailyLimit: Int64?
    public var periodLimit: Int64?
    public var userDailyLimit: Int64?
    public var userPeriodLimit: Int64?
    /// Midnight in the company's `time_zone` that started today, and the next one (`reset_at`).
    public var dayStart: Date
    public var dayEnd: Date
    /// The current period's end (`reset_at` of the period windows).
    public var periodEnd: Date
    /// The company's counters.
    public var company: Used
    /// The users' counters that exist (all users, or the one asked for); absent users used 0.
    public var users: [UUID: Used]

    /// What `user` has used (0 and 0 when it has no counter yet).
    public func used(by user: UUID) -> Used {
        users[user] ?? Used(day: 0, period: 0)
    }

    /// One window: `{"used", "limit", "remaining", "reset_at"}` (limit and remaining null when unlimited).
    func window(used: Int64, limit: Int64?, resetAt: Date) -> JSON {
        let limit = enabled ? limit : 0
        return .obj([
            "used": .int(used), "limit": JSON(limit), "remaining": JSON(limit.map { max(0, $0 - used) }), "reset_at": JSON(resetAt),
        ])
    }

    /// The entry of a `features` array: the company's windows and, with `user`, that user's
    /// (`user_day` and `user_period` are null without one: the admin read's company level).
    public func json(user: UUID?) -> JSON {
        let mine = user.map(used(by:))
        return .obj([
            "id": .string(id), "name": .string(name), "enabled": .bool(enabled),
            "day": window(used: company.day, limit: dailyLimit, resetAt: dayEnd),
            "period": window(used: company.period, limit: periodLimit, resetAt: periodEnd),
            "user_day": mine.map { window(used: $0.day, limit: userDailyLimit, resetAt: dayEnd) } ?? .null,
            "user_period": mine.map { window(used: $0.period, limit: userPeriodLimit, resetAt: periodEnd) } ?? .null,
        ])
    }

    /// The entry of a user's own `features` in the admin read: only that user's windows.
    public func userJSON(_ user: UUID) -> JSON {
        let mine = used(by: user)
        return .obj([
            "id": .string(id), "name": .string(name), "enabled": .bool(enabled),
            "user_day": window(used: mine.day, limit: userDailyLimit, resetAt: dayEnd),
            "user_period": window(used: mine.period, limit: userPeriodLimit, resetAt: periodEnd),
        ])
    }

    /// The first window (in the admission's lock order: company period, company day, user
    /// period, user day) that `units` more for `user` would exceed, as a ``FeatureState`` for
    /// the `usage.feature` object and the RateLimit fields; `refused` is nil when all fit.
    public func check(units: Int64, user: UUID) -> FeatureState {
        let mine = used(by: user)
        let windows: [(kind: FeatureState.Kind, used: Int64, limit: Int64?)] = [
            (.init(.company, .period), company.period, periodLimit), (.init(.company, .day), company.day, dailyLimit),
            (.init(.user, .period), mine.period, userPeriodLimit), (.init(.user, .day), mine.day, userDailyLimit),
        ]
        let refused = windows.first { window in window.limit.map { window.used + units > $0 } ?? false }?.kind
        // Every window is reported (used 0 for a window never charged), so the RateLimit fields
        // name each bounded limit.
        return FeatureState(
            id: id, name: name, refused: refused, message: nil, dayStart: dayStart, dayEnd: dayEnd,
            values: windows.map { (used: $0.used, limit: $0.limit) })
    }
}
