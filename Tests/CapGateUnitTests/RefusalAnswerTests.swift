import Foundation
import Testing

@testable import CapGate

/// Refusal → answer: every refusal the admission can decide, as the proxy and
/// `/v1/usage/check` answer it (no database, no socket).
@Suite("Refusals and their answers")
struct RefusalAnswerTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    static func state(companyUsed: Int64 = 100, companyLimit: Int64? = 100, userUsed: Int64 = 7, userLimit: Int64? = 10) -> UsageState {
        var state = UsageState(
            plan: .init(id: "starter", name: "Starter"), periodStart: now.addingTimeInterval(-86_400),
            periodEnd: now.addingTimeInterval(3_600.5), companyUsed: companyUsed, companyLimit: companyLimit, userUsed: userUsed,
            userLimit: userLimit)
        state.upgrade = .init(plan: "pro", companyLimit: 1_000, userLimit: nil)
        return state
    }

    static func usage(_ error: GatewayError) -> [String: JSON] {
        guard case .object(let fields)? = error.usage else { return [:] }
        return Dictionary(fields.map { ($0.key, $0.value) }, uniquingKeysWith: { a, _ in a })
    }

    @Test("a cap: 402 usage_cap_exceeded, the refusing scope, RateLimit fields, Retry-After to the period's end, the upgrade")
    func cap() throws {
        let error = Responder.error(for: .cap(.company), state: Self.state(), now: Self.now)
        #expect(error.status.code == 402)
        #expect(error.type == "usage_cap_exceeded")
        #expect(error.headers[.retryAfter] == "3601")
        #expect(error.headers[.rateLimitPolicy] != nil)
        #expect(error.message.contains("all 100 analyses") && error.message.contains("pro plan"))
        let usage = Self.usage(error)
        #expect(usage["scope"]?.stringValue == "company")
        #expect(usage["upgrade"]?["plan"]?.stringValue == "pro")
        #expect(usage["feature"] == nil)

        let user = Responder.error(for: .cap(.user), state: Self.state(), now: Self.now)
        #expect(Self.usage(user)["scope"]?.stringValue == "user")
        // The state's user has used 7 of 10: the call needed more than the 3 left.
        #expect(user.message.hasPrefix("You have used 7 of the 10 analyses allowed per user"), "\(user.message)")
        #expect(user.message.contains("This call needs more than what is left."))
    }

    @Test("no plan: 402 no_active_plan, scope company, Retry-After an hour, no RateLimit fields")
    func noPlan() {
        var state = UsageState(
            plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: 0, userLimit: nil)
        state.upgrade = .init(plan: "starter", companyLimit: 100, userLimit: 10)
        let error = Responder.error(for: .noActivePlan, state: state, now: Self.now)
        #expect(error.status.code == 402)
        #expect(error.type == "no_active_plan")
        #expect(error.headers[.retryAfter] == "3600")
        #expect(error.headers[.rateLimit] == nil)
        #expect(Self.usage(error)["scope"]?.stringValue == "company")
        #expect(Self.usage(error)["period"] == .null)
    }

    @Test("a feature's window: 402 feature_limit_exceeded with the window that refused and Retry-After to its reset")
    func featureLimit() {
        var state = Self.state(companyUsed: 5)
        let dayEnd = Self.now.addingTimeInterval(600)
        state.feature = FeatureState(
            id: "analysis", name: "Analysis", refused: .init(.user, .day), message: nil, dayStart: dayEnd.addingTimeInterval(-86_400),
            dayEnd: dayEnd, values: [(10, nil), (3, nil), (4, 50), (2, 2)])
        state.feature?.upgradeLimit = 20
        let error = Responder.error(for: .featureLimit(feature: "analysis"), state: state, now: Self.now)
        #expect(error.status.code == 402)
        #expect(error.type == "feature_limit_exceeded")
        #expect(error.headers[.retryAfter] == "600")
        #expect(error.message.hasPrefix("You have used all 2 Analysis allowed today."))
        let usage = Self.usage(error)
        #expect(usage["scope"]?.stringValue == "user")
        #expect(usage["feature"]?["window"]?.stringValue == "day")
        #expect(usage["feature"]?["limit"]?.intValue == 2)
        #expect(usage["upgrade"]?["feature_limit"]?.intValue == 20)
    }

    @Test("a feature not in the plan: 402 feature_not_in_plan; the operator's own message wins")
    func featureNotInPlan() {
        var state = Self.state(companyUsed: 5)
        state.feature = FeatureState(id: "vision", name: "Vision", refused: nil, message: nil, dayStart: nil, dayEnd: nil, values: [])
        let error = Responder.error(for: .featureNotInPlan(feature: "vision"), state: state, now: Self.now)
        #expect(error.status.code == 402)
        #expect(error.message == "Vision is not included in your company's Starter plan. The pro plan includes it.")
        #expect(Self.usage(error)["feature"]?["window"] == .null)
        state.feature?.message = "Ask sales."
        #expect(Responder.error(for: .featureNotInPlan(feature: "vision"), state: state).message == "Ask sales.")
    }

    @Test("refusals that are not about usage carry no usage object: 400, 401, 403, 409, 422")
    func others() {
        let cases: [(Refusal, Int, String)] = [
            (.unknownFeature("nope"), 400, "invalid_request_error"),
            (.unknownUser, 401, "authentication_error"),
            (.notBound(feature: "vision", bound: ["analysis"], credential: .jwt), 403, "permission_error"),
            (.idempotency(.idempotencyInFlight, maxKeptBytes: 10), 409, "idempotency_conflict"),
            (.idempotency(.idempotencyNotKept, maxKeptBytes: 10), 409, "idempotency_conflict"),
            (.idempotency(.idempotencyMismatch, maxKeptBytes: 10), 422, "idempotency_key_reused"),
        ]
        for (refusal, status, type) in cases {
            let error = Responder.error(for: refusal, state: .unknown)
            #expect(Int(error.status.code) == status, "\(refusal)")
            #expect(error.type == type && refusal.errorType == type, "\(refusal)")
            #expect(error.usage == nil, "\(refusal)")
        }
        let bound = Responder.error(for: .notBound(feature: "vision", bound: ["analysis"], credential: .jwt), state: .unknown)
        #expect(bound.message.hasPrefix("This token may be charged only to the features it is bound to: analysis;"))
    }

    @Test("every admission decision maps to one refusal (or none for a charge); the route's own inactive feature is not the caller's 400")
    func decisions() {
        let routeFeature = CallCost(units: 1, feature: "analysis", featureFromHeader: false, rule: nil)
        let headerFeature = CallCost(units: 1, feature: "analysis", featureFromHeader: true, rule: nil)
        func refusal(_ decision: Admission.Decision, _ cost: CallCost = routeFeature) -> Refusal? {
            Admitter.refusal(decision, cost: cost, credential: .apiKey, maxKeptBytes: 64)
        }
        #expect(refusal(.charged) == nil)
        #expect(refusal(.idempotencyReplay) == nil)
        #expect(refusal(.companyCap) == .cap(.company))
        #expect(refusal(.userCap) == .cap(.user))
        #expect(refusal(.noActivePlan) == .noActivePlan)
        #expect(refusal(.unknownUser) == .unknownUser)
        #expect(refusal(.unknownFeature) == .featureNotInPlan(feature: "analysis"))
        #expect(refusal(.unknownFeature, headerFeature) == .unknownFeature("analysis"))
        #expect(refusal(.featureNotInPlan) == .featureNotInPlan(feature: "analysis"))
        #expect(refusal(.featureLimitExceeded) == .featureLimit(feature: "analysis"))
        #expect(refusal(.featureNotBound) == .notBound(feature: "analysis", bound: nil, credential: .apiKey))
        #expect(refusal(.idempotencyMismatch) == .idempotency(.idempotencyMismatch, maxKeptBytes: 64))
    }

    @Test("usage/check's usage object is the refusal's: scope and feature as the 402 shows them")
    func dryRunUsage() {
        let state = Self.state()
        #expect(Responder.usage(for: nil, state: state)["scope"]?.stringValue == "user")
        #expect(Responder.usage(for: .cap(.company), state: state)["scope"]?.stringValue == "company")
        #expect(Responder.usage(for: .notBound(feature: "x", bound: [], credential: .apiKey), state: state)["scope"]?.stringValue == "user")
        #expect(Responder.usage(for: .cap(.user), state: state) == Responder.error(for: .cap(.user), state: state).usage)
    }

    @Test("a refund gives back every counter the call charged, never below zero")
    func refunded() {
        var state = Self.state(companyUsed: 3, userUsed: 1)
        state.feature = FeatureState(
            id: "a", name: "A", refused: nil, message: nil, dayStart: nil, dayEnd: nil, values: [(2, 10), (nil, nil), (5, nil), (nil, nil)])
        let after = state.refunded(units: 2)
        #expect(after.companyUsed == 1 && after.userUsed == 0)
        #expect(after.feature?.counters.map(\.used) == [0, 3])
    }
}
