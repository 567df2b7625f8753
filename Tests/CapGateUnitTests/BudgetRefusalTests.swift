import Foundation
import Testing

@testable import CapGate

/// SPEC §11's refusals of a call's cost and §14's unpassable token hold, as the proxy and
/// `/v1/usage/check` answer them (Proxy/Responder+Refusal.swift): 402 `budget_exceeded` with
/// `usage.cost` in decimal strings and Retry-After to the period's end; 400
/// `invalid_request_error` for what cannot be held, naming the model, `max_tokens`, the tool
/// type or the limit.
@Suite("Budget refusals and calls that cannot be held")
struct BudgetRefusalTests {
    static let now = RefusalAnswerTests.now

    static func state(user: CostState.Counter? = nil) -> UsageState {
        var state = RefusalAnswerTests.state(companyUsed: 5, userUsed: 1)
        state.cost = CostState(company: .init(used: 4_000_000, held: 500_000, limit: 5_000_000), user: user, hold: 700_000)
        return state
    }

    @Test("a company budget: 402 budget_exceeded, usage.cost with the counter and the hold, Retry-After to the period's end")
    func companyBudget() {
        let error = Responder.error(for: .budget(.company), state: Self.state(), now: Self.now)
        #expect(error.status.code == 402 && error.type == "budget_exceeded")
        #expect(error.headers[.retryAfter] == "3601")
        let usage = RefusalAnswerTests.usage(error)
        #expect(usage["scope"]?.stringValue == "company")
        #expect(usage["cost"]?.serialized() == #"{"scope":"company","used":"4","held":"0.5","limit":"5","remaining":"0.5","hold":"0.7"}"#)
        #expect(
            error.message.hasPrefix(
                "Your company's $5 budget for this period does not cover this call: $4 is spent and $0.5 held for calls in progress;"
                    + " this call could cost up to $0.7."))
    }

    @Test("a user budget: scope user, the user's counter; a scope with no counter reads as unlimited zeros")
    func userBudget() {
        let state = Self.state(user: .init(used: 250_000, held: 0, limit: 300_000))
        let error = Responder.error(for: .budget(.user), state: state, now: Self.now)
        #expect(RefusalAnswerTests.usage(error)["scope"]?.stringValue == "user")
        #expect(
            RefusalAnswerTests.usage(error)["cost"]?.serialized()
                == #"{"scope":"user","used":"0.25","held":"0","limit":"0.3","remaining":"0.05","hold":"0.7"}"#)
        #expect(error.message.hasPrefix("Your $0.3 budget for this period"))
        let none = Responder.error(for: .budget(.user), state: Self.state(), now: Self.now)
        #expect(
            RefusalAnswerTests.usage(none)["cost"]?.serialized()
                == #"{"scope":"user","used":"0","held":"0","limit":null,"remaining":null,"hold":"0.7"}"#)
    }

    @Test(
        "what cannot be held is 400 invalid_request_error, no usage object: an unpriced model named, max_tokens missing, a tool type named")
    func cannotHold() {
        let cases: [(Refusal, String)] = [
            (.unpricedModel("claude-x"), #"The model "claude-x" has no price in this gateway's price book"#),
            (.unpricedModel(nil), "The call names no model, so it has no price"),
            (.maxTokensRequired, "A cost budget or a token rate limit applies to this call: max_tokens (a whole number) is required"),
            (.unboundedCall(unknownTool: "computer_20990101"), #"This call uses the tool type "computer_20990101""#),
            (
                .unboundedCall(unknownTool: nil),
                "A cost budget or a token rate limit applies to this call, and its body lets the provider bill"
            ),
        ]
        for (refusal, start) in cases {
            let error = Responder.error(for: refusal, state: Self.state(), now: Self.now)
            #expect(error.status.code == 400 && error.type == "invalid_request_error" && error.usage == nil, "\(refusal)")
            #expect(error.message.hasPrefix(start), "\(error.message)")
            #expect(error.message.contains("Nothing was charged."), "\(refusal)")
        }
    }

    @Test("a hold over a token window's limit (SPEC §14): 400 naming max_tokens, the hold, the limit and the window, never a 429")
    func holdOverWindow() {
        let error = Responder.error(for: .holdOverRateLimit(.userTPM, limit: 50_000, hold: 64_000), state: .unknown, now: Self.now)
        #expect(error.status.code == 400 && error.type == "invalid_request_error" && error.headers[.retryAfter] == nil)
        #expect(
            error.message
                == "This call holds 64000 tokens (its prompt bound plus max_tokens), more than your 50000 tokens a minute (user-tpm), so it can never be admitted. Lower max_tokens (or the prompt) so that the call fits in 50000 tokens. Nothing was charged."
        )
        let company = Responder.error(for: .holdOverRateLimit(.companyTPM, limit: 10, hold: 11), state: .unknown, now: Self.now)
        #expect(company.message.contains("more than your company's 10 tokens a minute (company-tpm)"))
    }

    @Test("Retry-After: whole seconds up to the reset, at least 1; an hour when nothing renews by itself")
    func retryAfter() {
        let now = Self.now
        #expect(Responder.retryAfter(until: nil, now: now) == "3600")
        #expect(Responder.retryAfter(until: now.addingTimeInterval(0.2), now: now) == "1")
        #expect(Responder.retryAfter(until: now.addingTimeInterval(-30), now: now) == "1")
        #expect(Responder.retryAfter(until: now.addingTimeInterval(59.1), now: now) == "60")
        #expect(Responder.retryAfter(until: now.addingTimeInterval(86_400), now: now) == "86400")
    }
}
