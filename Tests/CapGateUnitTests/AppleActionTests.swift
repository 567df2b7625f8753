import Foundation
import Testing

@testable import CapGate

@Suite("App Store notification types to store events (SPEC §12)")
struct AppleActionTests {
    @Test("every notificationType / subtype of §12")
    func mapping() {
        let cases: [(String, String?, AppleAction)] = [
            ("SUBSCRIBED", "INITIAL_BUY", .event(.purchase)), ("SUBSCRIBED", "RESUBSCRIBE", .event(.purchase)),
            ("DID_RENEW", nil, .event(.renewal)), ("DID_RENEW", "BILLING_RECOVERY", .event(.renewal)),
            ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", .event(.cancel)),
            ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", .event(.resume)),
            ("DID_CHANGE_RENEWAL_PREF", "UPGRADE", .event(.purchase)), ("DID_CHANGE_RENEWAL_PREF", "DOWNGRADE", .store(.kept)),
            ("OFFER_REDEEMED", "INITIAL_BUY", .event(.purchase)), ("OFFER_REDEEMED", "RESUBSCRIBE", .event(.purchase)),
            ("OFFER_REDEEMED", "UPGRADE", .event(.purchase)), ("OFFER_REDEEMED", "DOWNGRADE", .store(.kept)),
            ("DID_FAIL_TO_RENEW", "GRACE_PERIOD", .grace), ("DID_FAIL_TO_RENEW", nil, .event(.expire)),
            ("EXPIRED", "VOLUNTARY", .event(.expire)), ("EXPIRED", "BILLING_RETRY", .event(.expire)),
            ("GRACE_PERIOD_EXPIRED", nil, .event(.expire)), ("REFUND", nil, .event(.refund)), ("REVOKE", nil, .event(.refund)),
            ("REFUND_REVERSED", nil, .event(.restore)), ("ONE_TIME_CHARGE", nil, .event(.purchase)), ("TEST", nil, .store(.stored)),
            ("PRICE_INCREASE", "PENDING", .store(.stored)), ("RENEWAL_EXTENDED", nil, .store(.stored)),
        ]
        for (type, subtype, expected) in cases {
            #expect(AppleAction.of(type: type, subtype: subtype, oneTime: false) == expected, "\(type) \(subtype ?? "")")
        }
        // A consumable's events are a top-up's (SPEC §12): granted, refunded, restored; nothing else.
        for (type, expected) in [
            ("ONE_TIME_CHARGE", AppleAction.event(.purchase)), ("REFUND", .event(.refund)), ("REVOKE", .event(.refund)),
            ("REFUND_REVERSED", .event(.restore)), ("CONSUMPTION_REQUEST", .store(.stored)), ("SUBSCRIBED", .store(.stored)),
            ("DID_RENEW", .store(.stored)), ("EXPIRED", .store(.stored)),
        ] {
            #expect(AppleAction.of(type: type, subtype: nil, oneTime: true) == expected, "\(type)")
        }
    }

    @Test("the admin route takes only §5's six types")
    func postedKinds() {
        #expect(BillingStore.StoreEvent.Kind.posted.map(\.rawValue) == ["purchase", "renewal", "cancel", "refund", "expire", "restore"])
    }
}
