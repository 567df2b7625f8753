import Foundation

/// Why a call is not forwarded, as its admission (or `/v1/usage/check`'s dry run of it) decided.
/// Nothing was charged for any of them; ``Responder`` turns each into its answer.
public enum Refusal: Sendable, Equatable {
    /// Whose counter refused: the company's or the user's.
    public enum Scope: String, Sendable {
        case company, user
    }

    /// The company has no plan period now (402 `no_active_plan`).
    case noActivePlan
    /// The company's or the user's cap for the period is reached (402 `usage_cap_exceeded`).
    case cap(Scope)
    /// The call's feature is not in the plan, disabled there, or (named by the route itself) no
    /// longer active (402 `feature_not_in_plan`).
    case featureNotInPlan(feature: String)
    /// A window of the call's feature is spent (402 `feature_limit_exceeded`); which one is the
    /// usage state's `feature.refused`.
    case featureLimit(feature: String)
    /// `CapGate-Feature` names a feature that does not exist or is not active (400).
    case unknownFeature(String)
    /// A credential bound to features used for another one (403, SPEC §8); `bound` is the list
    /// when it is known here (a token's claim), nil for an API key's (read in the transaction).
    case notBound(feature: String, bound: [String]?, credential: UserIdentity.Credential)
    /// The user is unknown or disabled in its company (401).
    case unknownUser
    /// The `Idempotency-Key` refused it: in flight or not kept (409), used for another request (422).
    case idempotency(Admission.Decision, maxKeptBytes: Int)
    /// The call's hold does not fit the company's or the user's cost budget (402 `budget_exceeded`).
    case budget(Scope)
    /// A budget applies and the call's model (nil: it names none) has no price (400).
    case unpricedModel(String?)
    /// A budget applies and the call has no `max_tokens` (400).
    case maxTokensRequired
    /// A budget applies and the price book cannot bound the call's body (400); `unknownTool`: the
    /// provider-defined tool type that makes it so, when that is the reason.
    case unboundedCall(unknownTool: String?)
    /// A rate window is full, or the user has as many calls in flight as allowed (429
    /// `rate_limit_error`; SPEC §14).
    case rate(RateState.Window)
    /// The call's own token hold is over a token window's limit (`limit`): it can never be
    /// admitted (400 naming `max_tokens` and the limit; SPEC §14).
    case holdOverRateLimit(RateState.Window, limit: Int64, hold: Int64)

    /// The SPEC's `error.type` of the answer (`/v1/usage/check`'s `reason`).
    public var errorType: String {
        switch self {
        case .noActivePlan: "no_active_plan"
        case .cap: "usage_cap_exceeded"
        case .featureNotInPlan: "feature_not_in_plan"
        case .featureLimit: "feature_limit_exceeded"
        case .unknownFeature: "invalid_request_error"
        case .notBound: "permission_error"
        case .unknownUser: "authentication_error"
        case .idempotency(let decision, _): decision == .idempotencyMismatch ? "idempotency_key_reused" : "idempotency_conflict"
        case .budget: "budget_exceeded"
        case .unpricedModel, .maxTokensRequired, .unboundedCall, .holdOverRateLimit: "invalid_request_error"
        case .rate: "rate_limit_error"
        }
    }
}
