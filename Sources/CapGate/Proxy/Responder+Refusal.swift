import Foundation
import HTTPTypes
import Hummingbird

/// Every answer a call gets that is not the provider's: a ``Refusal`` becomes its 400, 401,
/// 402, 403, 409 or 422 in the SPEC's envelope, with the `usage` object, the RateLimit fields
/// and `Retry-After` where they apply. The proxy and `/v1/usage/check` both answer from here,
/// so a dry run shows exactly what the call would get. (The provider's answers are passed back
/// by ``Responder/respond(_:to:record:)``.)
extension Responder {
    /// The answer to a refused call; `state` is the usage the admission saw.
    static func error(for refusal: Refusal, state: UsageState, now: Date = Date()) -> GatewayError {
        switch refusal {
        case .noActivePlan:
            return paymentRequired(
                refusal, "Your company has no active plan right now. Ask your administrator to choose a plan.", state: state,
                headers: [.retryAfter: retryAfter(until: state.periodEnd, now: now)])
        case .cap(let scope):
            return paymentRequired(
                refusal, capMessage(scope: scope, state: state), state: state,
                headers: limitHeaders(state, until: state.periodEnd, now: now))
        case .featureNotInPlan(let feature):
            return paymentRequired(
                refusal, featureNotInPlanMessage(feature, state: state), state: state,
                headers: [.retryAfter: retryAfter(until: state.periodEnd, now: now)])
        case .featureLimit(let feature):
            let refused = state.feature?.refused
            let reset = refused.flatMap { state.feature?.resetAt($0, periodEnd: state.periodEnd) } ?? state.periodEnd
            let message = state.feature?.message ?? featureLimitMessage(name: state.feature?.name ?? feature, state: state, reset: reset)
            return paymentRequired(refusal, message, state: state, headers: limitHeaders(state, until: reset, now: now))
        case .budget(let scope):
            return paymentRequired(
                refusal, budgetMessage(scope: scope, state: state), state: state,
                headers: limitHeaders(state, until: state.periodEnd, now: now))
        case .rate(let window):
            return GatewayError(
                .init(code: 429), refusal.errorType, rateMessage(window, state: state), usage: usage(for: refusal, state: state, now: now),
                headers: limitHeaders(state, until: state.rate?.resetAt(window, now: now), now: now))
        case .unknownFeature(let feature):
            return GatewayError.invalidRequest(
                "CapGate-Feature names \"\(feature)\", which is not a feature of this gateway or is not active.")
        case .notBound(let feature, let bound, let credential):
            return GatewayError.permission(notBoundMessage(feature, bound: bound, credential: credential))
        case .unknownUser:
            return GatewayError.authentication("This user is unknown or disabled in its company.")
        case .idempotency(let decision, let maxKeptBytes):
            return IdempotencyKey.refusal(decision, maxKeptBytes: maxKeptBytes)
                ?? GatewayError.conflict("This Idempotency-Key cannot be used for this request.")
        case .holdOverRateLimit(let window, let limit, let hold):
            return GatewayError.invalidRequest(holdOverRateLimitMessage(window, limit: limit, hold: hold))
        case .unpricedModel(let model):
            let which = model.map { "The model \"\($0)\" has no price" } ?? "The call names no model, so it has no price"
            return GatewayError.invalidRequest(
                "\(which) in this gateway's price book, and a cost budget or a token rate limit applies to it, so it cannot be held. "
                    + "Nothing was charged. Ask your administrator to price the model.")
        case .maxTokensRequired:
            return GatewayError.invalidRequest(
                "A cost budget or a token rate limit applies to this call: max_tokens (a whole number) is required to bound it. "
                    + "Nothing was charged.")
        case .unboundedCall(let tool):
            return GatewayError.invalidRequest(unboundedCallMessage(tool: tool))
        }
    }

    /// A 402 with the `usage` object.
    private static func paymentRequired(
        _ refusal: Refusal, _ message: String, state: UsageState, headers: HTTPFields
    ) -> GatewayError {
        GatewayError(.init(code: 402), refusal.errorType, message, usage: usage(for: refusal, state: state), headers: headers)
    }

    /// The RateLimit fields of `state` and a `Retry-After` until `reset`.
    private static func limitHeaders(_ state: UsageState, until reset: Date?, now: Date) -> HTTPFields {
        var headers = state.rateLimitHeaders(now: now)
        headers[.retryAfter] = retryAfter(until: reset, now: now)
        return headers
    }

    static func featureNotInPlanMessage(_ feature: String, state: UsageState) -> String {
        let name = state.feature?.name ?? feature
        let upgrade = state.upgrade.map { " The \($0.plan) plan includes it." } ?? ""
        return state.feature?.message ?? "\(name) is not included in your company's \(state.plan?.name ?? "current") plan.\(upgrade)"
    }

    static func notBoundMessage(_ feature: String, bound: [String]?, credential: UserIdentity.Credential) -> String {
        let what = credential == .jwt ? "This token" : "This API key"
        let list = bound.map { $0.isEmpty ? " (none)" : ": " + $0.joined(separator: ", ") } ?? ""
        return "\(what) may be charged only to the features it is bound to\(list); this call uses \"\(feature)\". "
            + "Nothing was charged. Use a credential for \(feature), or a route of your own feature."
    }

    static func holdOverRateLimitMessage(_ window: RateState.Window, limit: Int64, hold: Int64) -> String {
        let whose = window == .companyTPM ? "your company's" : "your"
        return "This call holds \(hold) tokens (its prompt bound plus max_tokens), more than \(whose) \(limit) tokens a minute "
            + "(\(window.rawValue)), so it can never be admitted. Lower max_tokens (or the prompt) so that the call fits "
            + "in \(limit) tokens. Nothing was charged."
    }

    static func unboundedCallMessage(tool: String?) -> String {
        if let tool {
            return "This call uses the tool type \"\(tool)\", whose tokens the provider adds to the prompt and this gateway does not "
                + "know (costs.toolOverheadTokens lists the tool types it can hold), and a cost budget or a token rate limit "
                + "applies to it, so it cannot be held. Nothing was charged. Ask your administrator to add the tool type."
        }
        return
            "A cost budget or a token rate limit applies to this call, and its body lets the provider bill tokens that cannot be bounded "
            + "(server tools such as web search or code execution, MCP servers, a message batch, a premium-priced mode "
            + "such as \"speed\": \"fast\" or an \"inference_geo\" other than \"global\", or a body that is not "
            + "a JSON call naming its model). Nothing was charged."
    }

    static func rateMessage(_ window: RateState.Window, state: UsageState) -> String {
        let feature = state.rate?.refusedFeature == true ? state.rate?.feature : nil
        let limit = (feature?.limits ?? state.rate?.limits)?[window].map(String.init) ?? "its"
        let of = feature.map { " of \(state.feature?.name ?? $0.id)" } ?? ""
        let again = " Nothing was charged; try again in a moment."
        switch window {
        case .companyRPM: return "Your company has made its \(limit) calls\(of) allowed this minute.\(again)"
        case .userRPM: return "You have made your \(limit) calls\(of) allowed this minute.\(again)"
        case .companyTPM: return "Your company's calls\(of) this minute have reached its \(limit) tokens a minute.\(again)"
        case .userTPM: return "Your calls\(of) this minute have reached your \(limit) tokens a minute.\(again)"
        case .userConcurrency:
            return "You already have \(limit) calls\(of) in progress, as many as allowed at once. Nothing was charged; "
                + "try again when one has finished."
        }
    }

    static func budgetMessage(scope: Refusal.Scope, state: UsageState) -> String {
        let counter = scope == .company ? state.cost?.company : state.cost?.user
        let limit = counter?.limit.map { "$" + Micros($0).decimal } ?? "its"
        let spent =
            counter.map { " $\(Micros($0.used).decimal) is spent and $\(Micros($0.held).decimal) held for calls in progress;" } ?? ""
        let hold = state.cost?.hold.map { " this call could cost up to $\(Micros($0).decimal)." } ?? ""
        let end = state.periodEnd.map { " The budget renews on \(Timestamp.format($0))." } ?? ""
        let whose = scope == .company ? "Your company's" : "Your"
        return "\(whose) \(limit) budget for this period does not cover this call:\(spent)\(hold)\(end)"
    }

    /// The `usage` object of a refusal (nil: the refusal is not about usage) or of an allowed dry
    /// run: the refusing scope, and for a feature's refusal its `feature` object.
    static func usage(for refusal: Refusal?, state: UsageState, now: Date = Date()) -> JSON {
        switch refusal {
        case .noActivePlan, .featureNotInPlan: state.json(scope: .company, featureRefusal: refusal != .noActivePlan)
        case .cap(let scope): state.json(scope: scope)
        case .featureLimit: state.json(scope: state.feature?.refused?.scope ?? .company, featureRefusal: true)
        case .budget(let scope): state.json(scope: scope, budgetRefusal: scope)
        case .rate(let window): state.json(scope: window.scope, rateRefusal: true, now: now)
        default: state.json(scope: .user)
        }
    }

    /// `Retry-After`: whole seconds until the refusing window renews, at least 1; with nothing to
    /// wait for (no plan), an hour: nothing renews by itself then.
    static func retryAfter(until reset: Date?, now: Date = Date()) -> String {
        guard let reset else { return "3600" }
        return String(max(1, Int(reset.timeIntervalSince(now).rounded(.up))))
    }

    static func capMessage(scope: Refusal.Scope, state: UsageState) -> String {
        let planName = state.plan?.name ?? "current"
        let end = state.periodEnd.map { " The allowance renews on \(Timestamp.format($0))." } ?? ""
        let upgrade = state.upgrade.map { " Upgrading to the \($0.plan) plan raises the limit." } ?? ""
        if scope == .company {
            let limit = state.companyLimit.map(String.init) ?? "unlimited"
            let left = Self.leftText(used: state.companyUsed, limit: state.companyLimit)
            return "Your company has used \(left.used)\(limit) analyses included in the \(planName) plan for this period.\(left.short)"
                + "\(end)\(upgrade)"
        }
        let limit = state.userLimit.map(String.init) ?? "unlimited"
        let left = Self.leftText(used: state.userUsed ?? 0, limit: state.userLimit)
        return "You have used \(left.used)\(limit) analyses allowed per user in this period.\(left.short)\(end)\(upgrade)"
    }

    /// How much of a limit a refusal's message says is used: "all " when nothing is left; else
    /// "2 of the " (a call of several units can need more than what is left), with a sentence saying so.
    static func leftText(used: Int64, limit: Int64?) -> (used: String, short: String) {
        guard let limit, used < limit else { return ("all ", "") }
        return ("\(used) of the ", " This call needs more than what is left.")
    }

    static func featureLimitMessage(name: String, state: UsageState, reset: Date?) -> String {
        let refused = state.feature?.refused
        let whose = refused?.scope == .user ? "You have" : "Your company has"
        let window = refused?.window == .day ? "today" : "in this period"
        let left = refused.map { Self.leftText(used: $0.used, limit: $0.limit) } ?? (used: "all ", short: "")
        // "all 3 analyses", "2 of the 3 analyses"; "all analyses" when the refusing window is not known.
        let amount = refused?.limit.map { "\(left.used)\($0) " } ?? "all "
        let when = reset.map { " It renews at \(Timestamp.format($0))." } ?? ""
        let upgrade = state.upgrade.map { " Upgrading to the \($0.plan) plan raises the limit." } ?? ""
        return "\(whose) used \(amount)\(name) allowed \(window).\(left.short)\(when)\(upgrade)"
    }
}
