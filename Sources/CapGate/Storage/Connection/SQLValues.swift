import Foundation

// How the admission functions spell kinds and "absent", turned into Swift's enums and optionals
// here and nowhere else. Text a function answers that this gateway does not know is mapped to
// the answer that lets nothing through (an unknown key, a member, no decision): a row is never
// refused while it is decoded, because its transaction has already committed by then.

extension KeyCheck {
    /// `auth` of a `capgate_admitted` row, or of the key check (``KnownKeys``); text this
    /// gateway does not know is an unknown key (401, nothing charged).
    init(sql text: String) {
        self = Self(rawValue: text) ?? .unknownKey
    }
}

extension UserIdentity.Role {
    /// `users.role`; anything but `admin` is a member (the lesser rights).
    init(sql text: String) {
        self = Self(rawValue: text) ?? .member
    }
}

extension Admission.Decision {
    /// `decision` of a `capgate_admitted` row; nil for NULL (a credential refused before any
    /// decision) and for text this gateway does not know (the call then fails, not forwarded).
    init?(sql text: String?) {
        guard let text, let decision = Self(rawValue: text) else { return nil }
        self = decision
    }
}

extension Refusal.Scope {
    /// `budget_scope` of a `capgate_admitted` row (company | user); nil for NULL or other text.
    init?(sql text: String?) {
        guard let text, let scope = Self(rawValue: text) else { return nil }
        self = scope
    }
}

extension FeatureState.Kind {
    /// `<scope>.<window>`: `company.period`, `company.day`, `user.period` or `user.day`
    /// (`feature_refused`, and `capgate_upgrade_offer`'s `p_window`); nil for anything else.
    init?(sql text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let scope = FeatureState.Scope(rawValue: String(parts[0])),
            let window = FeatureState.Window(rawValue: String(parts[1]))
        else { return nil }
        self.init(scope, window)
    }

    var sql: String { "\(scope.rawValue).\(window.rawValue)" }
}

extension RateState {
    /// Which window refused a call, as `rate_refused` names it: a window (`user-rpm`, …), or
    /// `feature.<window>` for one of the call's feature. Nil for NULL or a name this gateway does
    /// not know.
    struct Refused: Sendable, Equatable {
        var window: Window
        /// The window is the call's feature's, not the plan's.
        var feature: Bool

        static let featurePrefix = "feature."

        init(_ window: Window, feature: Bool) {
            self.window = window
            self.feature = feature
        }

        init?(sql text: String?) {
            guard let text else { return nil }
            let feature = text.hasPrefix(Self.featurePrefix)
            guard let window = Window(rawValue: feature ? String(text.dropFirst(Self.featurePrefix.count)) : text) else { return nil }
            self.init(window, feature: feature)
        }
    }
}

extension CostBound {
    /// `p_prompt` of the admission functions (`capgate_hold`): the prompt's tokens, −1 for the
    /// whole context window, −2 for a body that cannot be bounded.
    var promptParameter: Int64 {
        switch prompt {
        case .tokens(let tokens): tokens
        case .wholeWindow: -1
        case .cannotBound: -2
        }
    }

    /// `p_max_tokens`: the body's `max_tokens`, −1 when it has none.
    var maxTokensParameter: Int64 { maxTokens ?? -1 }

    /// `p_window`: the context window the request enables, 0 for the price book's.
    var windowParameter: Int64 { window ?? 0 }
}

extension Settlement.WindowTokens {
    /// `p_window_tokens` of `capgate_settle_batch`: the count, −1 when the usage is not known
    /// (the hold stays), −3 when the call holds nothing in a token window.
    var parameter: Int64 {
        switch self {
        case .notHeld: -3
        case .unknown: -1
        case .count(let tokens): tokens
        }
    }
}
