import Foundation
import NIOCore

/// What a metered call tells its caller and its ledger row: the 402's text and `Retry-After`,
/// the usage state after a refund, and the client-supplied text the ledger keeps.
extension ProxyHandler {
    /// `Retry-After` of a 402: whole seconds until the refusing window (the period) renews, at
    /// least 1; with no period (no plan), an hour: nothing renews by itself then.
    static func retryAfter(_ state: UsageState, now: Date = Date()) -> String {
        guard let end = state.periodEnd else { return "3600" }
        return String(max(1, Int(end.timeIntervalSince(now).rounded(.up))))
    }

    /// The state after this call's `units` were given back (every counter it charged).
    static func refunded(_ state: UsageState, units: Int) -> UsageState {
        var s = state
        let units = Int64(units)
        s.companyUsed = max(0, s.companyUsed - units)
        s.userUsed = s.userUsed.map { max(0, $0 - units) }
        if var feature = s.feature {
            for index in feature.counters.indices {
                feature.counters[index].used = max(0, feature.counters[index].used - units)
            }
            s.feature = feature
        }
        return s
    }

    /// Client-supplied text as the ledger stores it: at most `limit` characters, without NUL
    /// (which PostgreSQL text cannot hold).
    static func ledgerText(_ text: some StringProtocol, limit: Int) -> String {
        let clipped = text.prefix(limit)
        return clipped.contains("\u{0}") ? String(clipped.filter { $0 != "\u{0}" }) : String(clipped)
    }

    static func capMessage(scope: String, state: UsageState) -> String {
        let planName = state.plan?.name ?? "current"
        let end = state.periodEnd.map { " The allowance renews on \(Timestamp.format($0))." } ?? ""
        let upgrade = state.upgrade.map { " Upgrading to the \($0.plan) plan raises the limit." } ?? ""
        if scope == "company" {
            let limit = state.companyLimit.map(String.init) ?? "unlimited"
            return "Your company has used all \(limit) analyses included in the \(planName) plan for this period.\(end)\(upgrade)"
        }
        let limit = state.userLimit.map(String.init) ?? "unlimited"
        return "You have used all \(limit) analyses allowed per user in this period.\(end)\(upgrade)"
    }
}
