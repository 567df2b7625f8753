import Foundation

/// `GET /v1/usage/check`: how a call of `units` (naming a feature, or not) would be answered
/// now, decided in the admission's order (SPEC §2, §8): no plan, the feature not in the plan,
/// the company cap, the user cap, then the feature's windows (company period, company day, user
/// period, user day). A dry run: it reads the counters and records nothing.
struct UsageCheck {
    /// The answer: `reason` nil when allowed, else the error type a real call would get; `state`
    /// is rendered as `usage` with `scope`, with the refused feature's `usage.feature` when
    /// `featureRefusal` (the same object as the 402 body).
    struct Outcome {
        var reason: String?
        var scope: String
        var featureRefusal: Bool
        var state: UsageState
    }

    let units: Int64
    let user: UUID
    let state: UsageState
    /// nil: the call names no feature (`.unknown` is answered 400 before this).
    let feature: UsageStore.FeatureLookup?

    func decide(metering: MeteringStore) async throws -> Outcome {
        var state = self.state
        guard let plan = state.plan else {
            return Outcome(reason: "no_active_plan", scope: "company", featureRefusal: false, state: state)
        }
        var windows: FeatureState? = nil
        switch feature {
        case .notInPlan(let id, let name):
            state.feature = FeatureState(id: id, name: name, refused: nil, message: nil, dayStart: nil, dayEnd: nil, values: [])
            let offer = try await metering.featureUpgrade(from: plan.id, feature: id, refused: nil)
            state.upgrade = offer?.upgrade
            state.feature?.upgradeLimit = offer?.limit
            return Outcome(reason: "feature_not_in_plan", scope: "company", featureRefusal: true, state: state)
        case .entitled(let usage):
            windows = usage.check(units: units, user: user)
            // Its bounded windows appear in the RateLimit fields, as on a forwarded call.
            state.feature = windows
        case .unknown, nil:
            break
        }
        if let cap = state.companyLimit, state.companyUsed + units > cap {
            return Outcome(reason: "usage_cap_exceeded", scope: "company", featureRefusal: false, state: state)
        }
        if let cap = state.userLimit, (state.userUsed ?? 0) + units > cap {
            return Outcome(reason: "usage_cap_exceeded", scope: "user", featureRefusal: false, state: state)
        }
        if let windows, let refused = windows.refused {
            let offer = try await metering.featureUpgrade(from: plan.id, feature: windows.id, refused: refused)
            state.upgrade = offer?.upgrade
            state.feature?.upgradeLimit = offer?.limit
            return Outcome(reason: "feature_limit_exceeded", scope: refused.scope.rawValue, featureRefusal: true, state: state)
        }
        return Outcome(reason: nil, scope: "user", featureRefusal: false, state: state)
    }
}
