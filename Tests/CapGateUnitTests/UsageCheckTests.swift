import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// `GET /v1/usage/check?units=N` decided from counters already read (SPEC §2, §4, §12, §14;
/// Admin/UsageCheck.swift), in the admission's order: no plan, the company cap (a live top-up
/// may pay what the cap cannot), the user cap, then the rate windows. A call without a feature
/// asks the database nothing more: the store here is one whose PostgreSQL is never reached.
@Suite("Usage check: the dry run's decision")
struct UsageCheckTests {
    static let metering = MeteringStore(
        database: Database(
            client: PostgresClient(
                configuration: .init(host: "127.0.0.1", port: 9, username: "none", password: nil, database: nil, tls: .disable)),
            timeout: .milliseconds(100), logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })))

    static func state(company: (used: Int64, cap: Int64?), user: (used: Int64, cap: Int64?) = (0, nil)) -> UsageState {
        RefusalAnswerTests.state(companyUsed: company.used, companyLimit: company.cap, userUsed: user.used, userLimit: user.cap)
    }

    static func refusal(_ units: Int64, _ state: UsageState, grant: Int64 = 0, rate: RateState? = nil) async throws -> Refusal? {
        try await UsageCheck(units: units, user: UUID(), state: state, feature: nil, grantUnits: grant, rate: rate)
            .decide(metering: metering).refusal
    }

    @Test("no plan period contains now: no_active_plan, whatever the units")
    func noPlan() async throws {
        var state = Self.state(company: (0, nil))
        state.plan = nil
        #expect(try await Self.refusal(0, state) == .noActivePlan)
        #expect(try await Self.refusal(1, state) == .noActivePlan)
    }

    @Test("the company cap: units that end exactly at the cap pass, one more is refused; an unlimited cap takes any units")
    func companyCap() async throws {
        #expect(try await Self.refusal(5, Self.state(company: (95, 100))) == nil)
        #expect(try await Self.refusal(6, Self.state(company: (95, 100))) == .cap(.company))
        #expect(try await Self.refusal(1, Self.state(company: (100, 100))) == .cap(.company))
        #expect(try await Self.refusal(0, Self.state(company: (100, 100))) == nil)
        #expect(try await Self.refusal(1_000_000, Self.state(company: (10_000, nil))) == nil)
    }

    @Test("a live top-up pays what the cap has not left (SPEC §12): enough units in one grant pass, one unit short is refused")
    func grants() async throws {
        #expect(try await Self.refusal(5, Self.state(company: (98, 100)), grant: 3) == nil)
        #expect(try await Self.refusal(5, Self.state(company: (98, 100)), grant: 2) == .cap(.company))
        // Over the cap already (a lowered cap): the grant must pay the whole call.
        #expect(try await Self.refusal(2, Self.state(company: (110, 100)), grant: 2) == nil)
        #expect(try await Self.refusal(3, Self.state(company: (110, 100)), grant: 2) == .cap(.company))
    }

    @Test("the user cap after the company's: the user's own limit refuses; when both would, the company's is named")
    func userCap() async throws {
        #expect(try await Self.refusal(1, Self.state(company: (0, 100), user: (9, 10))) == nil)
        #expect(try await Self.refusal(2, Self.state(company: (0, 100), user: (9, 10))) == .cap(.user))
        #expect(try await Self.refusal(2, Self.state(company: (99, 100), user: (9, 10))) == .cap(.company))
        // A top-up is the company's: it never lifts a user's cap.
        #expect(try await Self.refusal(2, Self.state(company: (0, 100), user: (9, 10)), grant: 1_000) == .cap(.user))
    }

    @Test("rate windows last: a full minute refuses with its window (429) and the state carries it; caps are named first")
    func rateWindows() async throws {
        let minute = UnitTestSupport.time("2026-11-01T10:15:00Z")
        let full = RateState(limits: .init(userRPM: 2), minute: minute, counts: .init(userCalls: 2))
        #expect(try await Self.refusal(1, Self.state(company: (0, 100)), rate: full) == .rate(.userRPM))
        let outcome = try await UsageCheck(units: 1, user: UUID(), state: Self.state(company: (0, 100)), feature: nil, rate: full)
            .decide(metering: Self.metering)
        #expect(outcome.state.rate?.refused == .userRPM && outcome.state.rate?.refusedFeature == false)
        #expect(try await Self.refusal(1, Self.state(company: (100, 100)), rate: full) == .cap(.company))
        let room = RateState(limits: .init(userRPM: 2), minute: minute, counts: .init(userCalls: 1))
        #expect(try await Self.refusal(1, Self.state(company: (0, 100)), rate: room) == nil)
    }
}
