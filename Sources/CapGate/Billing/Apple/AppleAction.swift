import Foundation

/// What a notification does (SPEC §12's mapping of notificationType / subtype to §5's events).
enum AppleAction: Equatable, Sendable {
    /// Applied as this store event, to the transaction's product.
    case event(BillingStore.StoreEvent.Kind)
    /// `DID_FAIL_TO_RENEW` / `GRACE_PERIOD`: a renewal to the renewal info's `gracePeriodExpiresDate`.
    case grace
    /// Stored, nothing applied now: `DOWNGRADE` (the renewal that follows carries the new
    /// product), `TEST` and types CapGate does not apply.
    case store(Stored)

    enum Stored: String, Sendable {
        case kept, stored
    }

    /// The action for `type` and `subtype`; `oneTime` when the transaction is a consumable or
    /// non-consumable (a top-up, SPEC §12: `ONE_TIME_CHARGE` grants it, `REFUND`/`REVOKE` take
    /// back what is left of it, `REFUND_REVERSED` gives that back; its refund is not a
    /// subscription's, so the plan is left alone).
    static func of(type: String, subtype: String?, oneTime: Bool) -> AppleAction {
        if oneTime || type == "ONE_TIME_CHARGE" {
            switch type {
            case "ONE_TIME_CHARGE": return .event(.purchase)
            case "REFUND", "REVOKE": return .event(.refund)
            case "REFUND_REVERSED": return .event(.restore)
            default: return .store(.stored)
            }
        }
        switch (type, subtype) {
        case ("SUBSCRIBED", _): return .event(.purchase)
        case ("DID_RENEW", _): return .event(.renewal)
        case ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED"): return .event(.cancel)
        case ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED"): return .event(.resume)
        case ("DID_CHANGE_RENEWAL_PREF", "UPGRADE"), ("OFFER_REDEEMED", "UPGRADE"): return .event(.purchase)
        case ("DID_CHANGE_RENEWAL_PREF", "DOWNGRADE"), ("OFFER_REDEEMED", "DOWNGRADE"): return .store(.kept)
        case ("OFFER_REDEEMED", "INITIAL_BUY"), ("OFFER_REDEEMED", "RESUBSCRIBE"): return .event(.purchase)
        case ("DID_FAIL_TO_RENEW", "GRACE_PERIOD"): return .grace
        case ("DID_FAIL_TO_RENEW", nil), ("EXPIRED", _), ("GRACE_PERIOD_EXPIRED", _): return .event(.expire)
        case ("REFUND", _), ("REVOKE", _): return .event(.refund)
        case ("REFUND_REVERSED", _): return .event(.restore)
        default: return .store(.stored)
        }
    }

    /// Events keyed by Apple's `transactionId` (a purchase or renewal: the app's post of the same
    /// transaction and its notification are one event); every other is keyed by its notification.
    static func eventKey(_ kind: BillingStore.StoreEvent.Kind, transaction: AppleTransaction, notification: String?) -> String {
        switch kind {
        case .purchase, .renewal: return "apple:" + transaction.transactionId
        default: return "apple:notification:" + (notification ?? transaction.transactionId)
        }
    }
}
