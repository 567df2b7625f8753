import Foundation
import HTTPTypes

/// Where a caller stands in the current period: the SPEC's `usage` object and the RateLimit
/// header fields are both rendered from this.
public struct UsageState: Sendable {
    public struct PlanRef: Sendable {
        public var id: String
        public var name: String
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

    /// The SPEC §3 `usage` object.
    public func json(scope: String, includeUser: Bool = true) -> JSON {
        var fields: [JSON.Field] = [.init("scope", .string(scope))]
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
        fields.append(
            .init(
                "upgrade",
                upgrade.map {
                    .obj(["plan": .string($0.plan), "company_limit": JSON($0.companyLimit), "user_limit": JSON($0.userLimit)])
                } ?? .null
            )
        )
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
        if !policies.isEmpty {
            fields[.rateLimitPolicy] = policies.joined(separator: ", ")
            fields[.rateLimit] = states.joined(separator: ", ")
        }
        return fields
    }
}
