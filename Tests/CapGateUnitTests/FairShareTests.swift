import Foundation
import Testing

@testable import CapGate

/// SPEC §2's fair shares, counted in memory: `proxy.bodyBudgetBytes` over all calls
/// (Proxy/BodyBudget.swift) and one company's `proxy.companyShare` of it and of the provider
/// connections (Proxy/CompanyShare.swift): past its share a company's call is refused or waits,
/// other companies are unaffected.
@Suite("Fair shares: body budget and company share")
struct FairShareTests {
    static let a = UUID()
    static let b = UUID()

    @Test("the body budget: reservations fit up to the limit exactly, one byte more is refused until bytes are released")
    func bodyBudget() {
        let budget = BodyBudget(limit: 100)
        #expect(budget.reserve(60) && budget.reserve(40))
        #expect(budget.inUse == 100)
        #expect(!budget.reserve(1))
        budget.release(30)
        #expect(!budget.reserve(31) && budget.reserve(30))
        #expect(budget.reserve(0) && budget.reserve(-5) && budget.inUse == 100)
        budget.release(100)
        #expect(budget.inUse == 0 && !budget.reserve(101))
    }

    @Test("a company's share is percent of the total, rounded down, at least 1")
    func shareSize() {
        #expect(CompanyShare(total: 256 << 20, percent: 25).limit == 64 << 20)
        #expect(CompanyShare(total: 512, percent: 25).limit == 128)
        #expect(CompanyShare(total: 10, percent: 33).limit == 3)
        #expect(CompanyShare(total: 3, percent: 25).limit == 1)
        #expect(CompanyShare(total: 7, percent: 100).limit == 7)
        #expect(CompanyShare(total: 1 << 40, percent: 1).limit == (1 << 40) / 100)
    }

    @Test("one company past its share is refused; another company keeps its whole share; what is given back can be taken again")
    func perCompany() {
        let share = CompanyShare(total: 40, percent: 25)
        #expect(share.take(6, for: Self.a) && share.take(4, for: Self.a))
        #expect(!share.take(1, for: Self.a))
        #expect(share.take(10, for: Self.b) && share.held(by: Self.b) == 10)
        share.give(3, for: Self.a)
        #expect(share.held(by: Self.a) == 7 && share.take(3, for: Self.a) && !share.take(1, for: Self.a))
        #expect(share.take(0, for: Self.a))
        share.give(10, for: Self.a)
        #expect(share.held(by: Self.a) == 0)
    }

    @Test("a slot: at once while the share has room; a call waiting past it gets the slot its company gives back")
    func waiting() async {
        let share = CompanyShare(total: 4, percent: 50)
        #expect(await share.acquire(for: Self.a, timeout: .seconds(60)))
        #expect(await share.acquire(for: Self.a, timeout: .seconds(60)))
        let waiter = Task { await share.acquire(for: Self.a, timeout: .seconds(60)) }
        #expect(await share.acquire(for: Self.b, timeout: .seconds(60)))
        share.give(1, for: Self.a)
        #expect(await waiter.value)
        #expect(share.held(by: Self.a) == 2 && share.held(by: Self.b) == 1)
    }

    @Test("a waiting call whose task is cancelled gets no slot and holds nothing")
    func cancelled() async {
        let share = CompanyShare(total: 1, percent: 100)
        #expect(share.take(1, for: Self.a))
        let waiter = Task { await share.acquire(for: Self.a, timeout: .seconds(60)) }
        waiter.cancel()
        #expect(await waiter.value == false)
        #expect(share.held(by: Self.a) == 1)
    }

    @Test("a ticket gives its slot back exactly once: released twice, or dropped unreleased")
    func tickets() {
        let share = CompanyShare(total: 10, percent: 50)
        #expect(share.take(2, for: Self.a))
        let ticket = ShareTicket(share: share, company: Self.a)
        ticket.release()
        ticket.release()
        #expect(share.held(by: Self.a) == 1)
        do {
            _ = ShareTicket(share: share, company: Self.a)
        }
        #expect(share.held(by: Self.a) == 0)
    }
}
