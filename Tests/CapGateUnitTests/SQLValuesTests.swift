import Foundation
import Testing

@testable import CapGate

/// How the admission functions' text and "absent" values become enums and optionals
/// (Storage/SQLValues.swift): every value they send, and what text this gateway does not know
/// turns into (the answer that lets nothing through).
@Suite("SQL values: kinds and absent values at the border")
struct SQLValuesTests {
    @Test("auth: each check the functions answer; anything else is an unknown key, each a 401 of its own")
    func keyCheck() {
        let texts = ["ok", "unknown_key", "revoked_key", "expired_key", "disabled_user"]
        #expect(texts.map(KeyCheck.init(sql:)) == [.ok, .unknownKey, .revokedKey, .expiredKey, .disabledUser])
        #expect(KeyCheck.allCases.map(\.rawValue) == texts)
        for text in ["", "OK", "okay", "revoked", "unknown_user"] {
            #expect(KeyCheck(sql: text) == .unknownKey, "\(text)")
        }
        func message(_ check: KeyCheck) -> String { Authenticator.keyError(check).message }
        #expect(message(.revokedKey).contains("revoked") && message(.expiredKey).contains("expired"))
        #expect(message(.disabledUser).contains("disabled") && message(.unknownKey).hasPrefix("Unknown API key"))
        #expect(Authenticator.keyError(.disabledUser).status.code == 401)
        #expect(Set(KeyCheck.allCases.filter { $0 != .ok }.map(message)).count == 4)
    }

    @Test("role: admin and member; anything else is a member (the lesser rights)")
    func role() {
        #expect(UserIdentity.Role(sql: "admin") == .admin)
        #expect(UserIdentity.Role(sql: "member") == .member)
        for text in ["", "Admin", "owner", "operator"] {
            #expect(UserIdentity.Role(sql: text) == .member, "\(text)")
        }
    }

    @Test("decision: every decision by its text; NULL and text not known are no decision")
    func decision() {
        for decision in Admission.Decision.allCases {
            #expect(Admission.Decision(sql: decision.rawValue) == decision)
        }
        // The decisions of db/functions/capgate_admission.type.sql, as the functions spell them.
        #expect(
            Admission.Decision.allCases.map(\.rawValue) == [
                "charged", "company_cap", "user_cap", "no_active_plan", "unknown_user", "unknown_feature", "feature_not_bound",
                "feature_not_in_plan", "feature_limit_exceeded", "stale_routes", "idempotency_replay", "idempotency_in_flight",
                "idempotency_not_kept", "idempotency_mismatch", "budget_exceeded", "unpriced_model", "max_tokens_required",
                "unbounded_call", "rate_limited",
            ])
        #expect(Admission.Decision(sql: "company_cap") == .companyCap && Admission.Decision(sql: "rate_limited") == .rateLimited)
        for text in [nil, "", "Charged", "companyCap", "refused"] as [String?] {
            #expect(Admission.Decision(sql: text) == nil, "\(text ?? "NULL")")
        }
    }

    @Test("budget scope: company and user; NULL and anything else are none")
    func budgetScope() {
        #expect(Refusal.Scope(sql: "company") == .company)
        #expect(Refusal.Scope(sql: "user") == .user)
        for text in [nil, "", "User", "team"] as [String?] {
            #expect(Refusal.Scope(sql: text) == nil, "\(text ?? "NULL")")
        }
    }

    @Test("a feature's window: <scope>.<window> both ways, in the lock order; anything else is none")
    func featureKind() {
        let texts = ["company.period", "company.day", "user.period", "user.day"]
        #expect(texts.compactMap(FeatureState.Kind.init(sql:)) == FeatureState.Kind.lockOrder)
        #expect(FeatureState.Kind.lockOrder.map(\.sql) == texts)
        #expect(FeatureState.Kind(sql: "user.day") == FeatureState.Kind(.user, .day))
        for text in ["", ".", "company", "company.", ".day", "company.week", "team.day", "user.day.x", "user..day", "User.Day"] {
            #expect(FeatureState.Kind(sql: text) == nil, "\(text)")
        }
    }

    @Test("a refused rate window: its name, with feature. for the feature's; NULL and names not known are none")
    func rateRefused() {
        for window in RateState.Window.allCases {
            #expect(RateState.Refused(sql: window.rawValue) == RateState.Refused(window, feature: false))
            #expect(RateState.Refused(sql: "feature." + window.rawValue) == RateState.Refused(window, feature: true))
        }
        for text in [nil, "", "feature.", "feature", "user_rpm", "feature.feature.user-rpm", "plan.user-rpm", "User-RPM"] as [String?] {
            #expect(RateState.Refused(sql: text) == nil, "\(text ?? "NULL")")
        }
    }

    @Test(
        "a cost bound's parameters: the tokens, -1 for the whole window, -2 unbounded; -1 without max_tokens; 0 for the price book's window"
    )
    func costBound() {
        let bound = CostBound(prompt: .tokens(1_500), maxTokens: 64, cache: .fiveMinutes, window: CostBound.largeWindow)
        #expect(bound.promptParameter == 1_500 && bound.maxTokensParameter == 64 && bound.windowParameter == 1_000_000)
        #expect(CostBound(prompt: .tokens(0), maxTokens: 0, cache: .none, window: nil).promptParameter == 0)
        #expect(CostBound(prompt: .wholeWindow, maxTokens: nil, cache: .none, window: nil).promptParameter == -1)
        let unbounded = CostBound.unbounded
        #expect(unbounded.promptParameter == -2 && unbounded.maxTokensParameter == -1 && unbounded.windowParameter == 0)
        #expect(unbounded.prompt == .cannotBound && unbounded.maxTokens == nil && unbounded.window == nil)
    }

    @Test("a settlement's token windows: the real count, -1 when the usage is not known, -3 when it holds none")
    func windowTokens() {
        let usage = ProviderUsage(inputTokens: 100, outputTokens: 20, cacheWrite5m: 3, cacheWrite1h: nil, cacheRead: -5, known: true)
        func settlement(_ usage: ProviderUsage, held: Bool) -> Settlement {
            Settlement(companyID: UUID(), ledgerID: 1, status: 200, usage: usage, endsInWindows: held)
        }
        #expect(settlement(usage, held: true).windowTokens == .count(123))
        #expect(settlement(usage, held: true).windowTokens.parameter == 123)
        #expect(settlement(ProviderUsage(inputTokens: 100), held: true).windowTokens == .unknown)
        #expect(settlement(ProviderUsage(inputTokens: 100), held: true).windowTokens.parameter == -1)
        #expect(settlement(usage, held: false).windowTokens == .notHeld)
        #expect(settlement(usage, held: false).windowTokens.parameter == -3)
        #expect(settlement(ProviderUsage(known: true), held: true).windowTokens.parameter == 0)
    }

    @Test("refund reasons: the metric's label values")
    func refundReasons() {
        #expect(
            RefundReason.allCases.map(\.rawValue) == ["share", "timeout", "unreachable", "upstream_status", "late_admission", "spooled"])
    }

    @Test("scopes: a rate window's owner")
    func windowScope() {
        #expect(RateState.Window.allCases.map(\.scope) == [.company, .company, .user, .user, .user])
    }
}
