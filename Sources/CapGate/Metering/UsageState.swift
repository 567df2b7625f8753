import Foundation
import HTTPTypes

/// Where a caller stands in the current period: the SPEC's `usage` object and the RateLimit
/// header fields are both rendered from this.
public struct UsageState: Sendable {
    public struct PlanRef: Sendable {
        public var id: String
        public var name: String

        package init(id: String, name: String) {
            self.id = id
            self.name = name
        }
    }
    public struct Upgrade: Sendable {
        public var plan: String
        public var companyLimit: Int64?
        public var userLimit: Int64?
    }

    public var plan: PlanRef?
    public var periodStart: Date?
    public var periodEnd: Date?
    public var companyUsed: Int64
    public var companyLimit: Int64?
    public var userUsed: Int64?
    public var userLimit: Int64?
    public var upgrade: Upgrade?
    /// The call's feature and its windows (SPEC §8), for the RateLimit fields and a refusal.
    public var feature: FeatureState?
    /// The cost counters and the call's hold (SPEC §11); nil before the counters were read.
    public var cost: CostState?
    /// The call's rate windows (SPEC §14); nil when none applied.
    public var rate: RateState?

    public init(
        plan: PlanRef?, periodStart: Date?, periodEnd: Date?, companyUsed: Int64, companyLimit: Int64?,
        userUsed: Int64?, userLimit: Int64?, upgrade: Upgrade? = nil
    ) {
        self.plan = plan
        self.periodStart = periodStart
        self.periodEnd = periodEnd
        self.companyUsed = companyUsed
        self.companyLimit = companyLimit
        self.userUsed = userUsed
        self.userLimit = userLimit
        self.upgrade = upgrade
    }

    static func counter(used: Int64, limit: Int64?) -> JSON {
        .obj([
            "used": .int(used),
            "limit": JSON(limit),
            "remaining": JSON(limit.map { max(0, $0 - used) }),
        ])
    }

    /// The SPEC §3 `usage` object; for a refusal by a feature (SPEC §8) with its `feature`
    /// object and the upgrade's `feature_limit`; for a usage read with the plan's `features`
    /// (SPEC §8, see ``FeatureUsage``).
    public func json(
        scope: Refusal.Scope, includeUser: Bool = true, featureRefusal: Bool = false, features: JSON? = nil,
        budgetRefusal: Refusal.Scope? = nil, rateRefusal: Bool = false, now: Date = Date()
    ) -> JSON {
        var fields: [JSON.Field] = [.init("scope", .string(scope.rawValue))]
        fields.append(.init("plan", plan.map { .obj(["id": .string($0.id), "name": .string($0.name)]) } ?? .null))
        if let periodStart, let periodEnd {
            fields.append(.init("period", .obj(["start": JSON(periodStart), "end": JSON(periodEnd)])))
        } else {
            fields.append(.init("period", .null))
        }
        fields.append(.init("company", Self.counter(used: companyUsed, limit: companyLimit)))
        if includeUser, let userUsed {
            fields.append(.init("user", Self.counter(used: userUsed, limit: userLimit)))
        }
        if let features {
            fields.append(.init("features", features))
        }
        if featureRefusal, let feature {
            if let refused = feature.refused {
                fields.append(.init("feature", featureJSON(feature, refused)))
            } else {
                // Not in the plan: nothing of it is included.
                fields.append(
                    .init(
                        "feature",
                        .obj([
                            "id": .string(feature.id), "name": .string(feature.name), "window": .null, "scope": .string(scope.rawValue),
                            "used": .int(0), "limit": .int(0), "remaining": .int(0), "reset_at": .null,
                        ])))
            }
        }
        var offer: [JSON.Field]? = upgrade.map {
            [.init("plan", .string($0.plan)), .init("company_limit", JSON($0.companyLimit)), .init("user_limit", JSON($0.userLimit))]
        }
        if featureRefusal, offer != nil {
            offer?.append(.init("feature_limit", JSON(feature?.upgradeLimit)))
        }
        fields.append(.init("upgrade", offer.map { .object($0) } ?? .null))
        if let budgetRefusal, let cost {
            fields.append(.init("cost", cost.refusalJSON(scope: budgetRefusal)))
        }
        if rateRefusal, let rate {
            fields.append(.init("rate", rate.refusalJSON(now: now)))
        }
        return .object(fields)
    }

    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), one entry per
    /// bounded cap; nothing when both are unlimited.
    public func rateLimitHeaders(now: Date = Date()) -> HTTPFields {
        var fields = HTTPFields()
        guard let periodStart, let periodEnd else { return fields }
        let window = max(0, Int(periodEnd.timeIntervalSince(periodStart).rounded()))
        let reset = max(0, Int(periodEnd.timeIntervalSince(now).rounded(.up)))
        var policies: [String] = []
        var states: [String] = []
        if let companyLimit {
            policies.append("\"company\";q=\(companyLimit);w=\(window)")
            states.append("\"company\";r=\(max(0, companyLimit - companyUsed));t=\(reset)")
        }
        if let userLimit, let userUsed {
            policies.append("\"user\";q=\(userLimit);w=\(window)")
            states.append("\"user\";r=\(max(0, userLimit - userUsed));t=\(reset)")
        }
        if let feature {
            let dayWindow = feature.dayStart.flatMap { start in feature.dayEnd.map { Int($0.timeIntervalSince(start).rounded()) } }
            let dayReset = feature.dayEnd.map { max(0, Int($0.timeIntervalSince(now).rounded(.up))) }
            for counter in feature.counters {
                guard let limit = counter.limit else { continue }
                let day = counter.window == .day
                guard let w = day ? dayWindow : window, let t = day ? dayReset : reset else { continue }
                let name = counter.policy(feature: feature.id)
                policies.append("\"\(name)\";q=\(limit);w=\(w)")
                states.append("\"\(name)\";r=\(max(0, limit - counter.used));t=\(t)")
            }
        }
        if let cost {
            let entries = cost.rateLimitEntries(window: window, reset: reset)
            policies += entries.policies
            states += entries.states
        }
        if let rate {
            let entries = rate.rateLimitEntries(now: now)
            policies += entries.policies
            states += entries.states
        }
        if !policies.isEmpty {
            fields[.rateLimitPolicy] = policies.joined(separator: ", ")
            fields[.rateLimit] = states.joined(separator: ", ")
        }
        return fields
    }

    /// The `usage.feature` object of a refusal: the window that refused.
    func featureJSON(_ feature: FeatureState, _ counter: FeatureState.Counter) -> JSON {
        .obj([
            "id": .string(feature.id), "name": .string(feature.name), "window": .string(counter.window.rawValue),
            "scope": .string(counter.scope.rawValue), "used": .int(counter.used), "limit": JSON(counter.limit),
            "remaining": JSON(counter.limit.map { max(0, $0 - counter.used) }),
            "reset_at": JSON(feature.resetAt(counter, periodEnd: periodEnd)),
        ])
    }
}

extension UsageState {
    /// No usage known: a refusal decided before the counters were read (a bound token's).
    static let unknown = UsageState(
        plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: nil, userLimit: nil)

    /// The state after a call's `units` were given back (every counter it charged).
    func refunded(units: Int) -> UsageState {
        var s = self
        let units = Int64(units)
        s.companyUsed = max(0, s.companyUsed - units)
        s.userUsed = s.userUsed.map { max(0, $0 - units) }
        if var feature = s.feature {
            for index in feature.counters.indices {
                feature.counters[index].used = max(0, feature.counters[index].used - units)
            }
            s.feature = feature
        }
        s.cost = s.cost?.refunded()
        s.rate = s.rate?.refunded()
        return s
    }
}
