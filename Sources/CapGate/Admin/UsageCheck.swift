import Foundation

/// `GET /v1/usage/check`: how a call of `units` (naming a feature, or not) would be answered
/// now, decided in the admission's order (SPEC §2, §8, §14): no plan, the feature not in the
/// plan, the company cap, the user cap, the feature's windows (company period, company day, user
/// period, user day), then the rate windows of the plan and of the feature's entitlement (a 429
/// `rate_limit_error`). A dry run: it
/// reads the counters and records nothing. Without a body it cannot price a call, so budgets and
/// the token a call would add to a token window are not read (a full token window is). The answer's
/// `reason` and `usage` come from ``Responder``, as a real call's refusal does.
struct UsageCheck {
    /// The refusal a real call would get now (nil: allowed), and the usage it would show.
    struct Outcome {
        var refusal: Refusal?
        var state: UsageState
    }

    let units: Int64
    let user: UUID
    let state: UsageState
    /// nil: the call names no feature (`.unknown` is answered 400 before this).
    let feature: UsageStore.FeatureLookup?
    /// The most units one live top-up grant has left (SPEC §12): a call the company cap cannot
    /// hold is admitted when one grant can pay what the cap has not left (the call is split: the
    /// plan pays what is left under its cap, one grant the rest).
    var grantUnits: Int64 = 0
    /// The plan's rate windows now, with the feature's entitlement's (nil: neither sets any).
    var rate: RateState? = nil

    func decide(metering: MeteringStore) async throws -> Outcome {
        var state = self.state
        guard let plan = state.plan else { return Outcome(refusal: .noActivePlan, state: state) }
        var windows: FeatureState? = nil
        switch feature {
        case .notInPlan(let id, let name):
            state.feature = FeatureState(id: id, name: name, refused: nil, message: nil, dayStart: nil, dayEnd: nil, values: [])
            try await offer(&state, decision: .featureNotInPlan, plan: plan.id, metering: metering)
            return Outcome(refusal: .featureNotInPlan(feature: id), state: state)
        case .entitled(let usage):
            windows = usage.check(units: units, user: user)
            // Its bounded windows appear in the RateLimit fields, as on a forwarded call.
            state.feature = windows
        case .unknown, nil:
            break
        }
        if let cap = state.companyLimit, state.companyUsed + units > cap, grantUnits < units - max(cap - state.companyUsed, 0) {
            return Outcome(refusal: .cap(.company), state: state)
        }
        if let cap = state.userLimit, (state.userUsed ?? 0) + units > cap {
            return Outcome(refusal: .cap(.user), state: state)
        }
        if let windows, windows.refused != nil {
            try await offer(&state, decision: .featureLimitExceeded, plan: plan.id, metering: metering)
            return Outcome(refusal: .featureLimit(feature: windows.id), state: state)
        }
        if var rate, let (window, isFeature) = rate.refusalNow() {
            rate.refused = window
            rate.refusedFeature = isFeature
            state.rate = rate
            if let limit = rate.holdOverRefusingLimit, let hold = rate.tokens {
                return Outcome(refusal: .holdOverRateLimit(window, limit: limit, hold: hold), state: state)
            }
            return Outcome(refusal: .rate(window), state: state)
        }
        return Outcome(refusal: nil, state: state)
    }

    /// A feature refusal's upgrade offer, as the admission row would carry it.
    func offer(_ state: inout UsageState, decision: Admission.Decision, plan: String, metering: MeteringStore) async throws {
        guard let feature = state.feature else { return }
        let offer = try await metering.upgradeOffer(decision, plan: plan, feature: feature.id, refused: feature.refused)
        state.upgrade = offer?.upgrade
        state.feature?.upgradeLimit = offer?.featureLimit
    }
}
