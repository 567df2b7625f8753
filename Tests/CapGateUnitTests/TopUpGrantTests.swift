import Foundation
import Testing

@testable import CapGate

/// A company's top-ups as the usage reads list them (SPEC §12, Billing/TopUpGrant.swift):
/// granted, used (settled costs plus open holds), remaining until `expires_at`, nothing left once
/// expired or refunded, and a status that says which.
@Suite("Top-up grants in usage reads")
struct TopUpGrantTests {
    static let granted = UnitTestSupport.time("2026-11-01T00:00:00Z")
    static let expires = UnitTestSupport.time("2027-11-01T00:00:00Z")
    static let during = UnitTestSupport.time("2026-11-15T00:00:00Z")

    static func grant(
        units: Int64? = 100, used: Int64 = 30, budget: Int64? = 5_000_000, cost: Int64 = 1_250_000, held: Int64 = 250_000
    )
        -> TopUpGrant
    {
        TopUpGrant(
            id: 7, productID: "pack.100", units: units, unitsUsed: used, budget: budget.map { Micros($0) }, costUsed: Micros(cost),
            costHeld: Micros(held), grantedAt: granted, expiresAt: expires, refundedAt: nil)
    }

    @Test("a live grant lists every key: granted, used (costs plus holds), held, remaining, its times and status active")
    func live() {
        #expect(
            Self.grant().json(at: Self.during).serialized()
                == #"{"id":7,"product_id":"pack.100","granted":{"units":100,"budget":"5"},"used":{"units":30,"budget":"1.5"},"held":"0.25","remaining":{"units":70,"budget":"3.5"},"granted_at":"2026-11-01T00:00:00Z","expires_at":"2027-11-01T00:00:00Z","refunded_at":null,"status":"active"}"#
        )
    }

    @Test("what a pack does not grant is null; remaining never goes below 0")
    func partial() {
        let unitsOnly = Self.grant(budget: nil).json(at: Self.during)
        #expect(unitsOnly["granted"]?["budget"] == .null && unitsOnly["used"]?["budget"] == .null && unitsOnly["held"] == .null)
        #expect(Self.grant(units: nil).remainingUnits(at: Self.during) == nil)
        #expect(Self.grant(used: 130).remainingUnits(at: Self.during) == 0)
        #expect(Self.grant(cost: 4_900_000, held: 200_000).remainingBudget(at: Self.during) == Micros(0))
    }

    @Test("at its expiry instant a grant is spent: nothing remains, status expired; a refund empties it at once")
    func ended() {
        let grant = Self.grant()
        #expect(grant.isLive(at: Self.expires.addingTimeInterval(-0.001)) && !grant.isLive(at: Self.expires))
        #expect(grant.remainingUnits(at: Self.expires) == 0 && grant.remainingBudget(at: Self.expires) == Micros(0))
        #expect(grant.json(at: Self.expires)["status"] == .string("expired"))
        var refunded = grant
        refunded.refundedAt = Self.during
        #expect(!refunded.isLive(at: Self.during) && refunded.remainingUnits(at: Self.during) == 0)
        #expect(refunded.json(at: Self.during)["status"] == .string("refunded"))
        #expect(refunded.json(at: Self.during)["refunded_at"] == .string("2026-11-15T00:00:00Z"))
    }

    @Test("used up only when nothing it grants is left: units gone with budget left stays active")
    func usedUp() {
        #expect(Self.grant(used: 100, budget: nil).json(at: Self.during)["status"] == .string("used_up"))
        #expect(Self.grant(used: 100).json(at: Self.during)["status"] == .string("active"))
        #expect(Self.grant(used: 100, cost: 5_000_000, held: 0).json(at: Self.during)["status"] == .string("used_up"))
        #expect(Self.grant(units: nil, cost: 4_000_000, held: 1_000_000).json(at: Self.during)["status"] == .string("used_up"))
    }
}
