import Foundation
import Testing

@testable import CapGate

/// SPEC §14: a call's token hold is settled to its real count. The settlement leaves what the
/// calls give back in the plan windows (the company's and the user's counter rows) to its gateway,
/// which writes it with its next admission batch (as that batch locks those rows anyway) or on its
/// own within the gather; until then the window counts the hold, never less than the calls took.
@Suite("Token give-backs ride the next admission", .timeLimit(.minutes(5)))
struct RateGiveBackTests {
    static func call(_ user: (id: UUID, key: String)) -> AdmissionItem {
        var item = BatchAdmissionTests.call(key: user.key, model: "claude-test")
        item.request.bound = CostBound(promptTokens: 400, maxTokens: 600, cache: .none, window: 0)
        return item
    }

    @Test(
        "while the gateway admits in batches, a settlement leaves its give-backs to the next batch, which applies them (its own rows and others); a lone call leaves them and a quiet gateway settles its own; a rolled-back batch hands them back; the gather writes the rest (with a budget: the settlement's cost path)",
        arguments: [false, true]
    )
    func giveBacksRideAdmissions(budget: Bool) async throws {
        try await Harness.with { h in
            if budget {
                try await h.createBudgetPlan("p", company: nil, user: nil, companyBudget: 1_000_000_000, userBudget: nil)
            } else {
                try await h.createPlan("p", company: nil, user: nil)
            }
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["company_tpm": 1_000_000, "user_tpm": 1_000_000]))
            let (company, users) = try await h.createCompany(plan: "p", users: 3)
            try await RateWindowTests.roomInMinute(20)
            let companyRow = "SELECT rate_tokens FROM company_usage WHERE company_id = '\(company.text)'"
            @Sendable func userRow(_ i: Int) -> String { "SELECT rate_tokens FROM user_usage WHERE user_id = '\(users[i].id.text)'" }
            @Sendable func ledger(_ i: Int) -> String {
                "SELECT coalesce(sum(rate_tokens), 0) FROM usage_ledger WHERE outcome = 'charged' AND user_id = '\(users[i].id.text)'"
            }
            try await BatchAdmissionTests.withMetering(h) { _, database in
                // Nothing is written on its own within the test (a 10-minute gather).
                let ends = SlotEnds(database: database, gather: .seconds(600))
                func admit(_ who: [Int]) async -> [AdmissionRow?] {
                    await MeteringStore.admitBatch(
                        who.map { Self.call(users[$0]) }, database: database, relaxed: false, slotEnds: ends
                    ).map { try? $0.get() }
                }
                func settle(_ rows: [AdmissionRow?], output: Int64) async throws {
                    let items = try rows.map { row in
                        Settlement(
                            companyID: company, ledgerID: try #require(row?.ledgerID), status: 200,
                            usage: ProviderUsage(inputTokens: 100, outputTokens: output, known: true), endsInWindows: true)
                    }
                    _ = await MeteringStore.settleBatch(items, database: database, slotEnds: ends)
                }
                let first = await admit([0, 1])
                #expect(first.map { $0?.decision } == ["charged", "charged"])
                let hold = try await h.scalar(userRow(0))
                #expect(hold == 1_000)
                try await settle(first, output: 20)
                // The ledger holds the real counts; the windows still hold the holds.
                #expect(try await h.scalar(ledger(0)) == 120)
                #expect(try await h.scalar(userRow(0)) == hold)
                #expect(try await h.scalar(companyRow) == 2 * hold)

                // A lone call (capgate_admit) carries none of them; after it, a settlement writes
                // its own (a quiet gateway: no batch to ride).
                let lone = await admit([2])
                #expect(lone.map { $0?.decision } == ["charged"])
                #expect(try await h.scalar(userRow(0)) == hold)
                #expect(try await h.scalar(companyRow) == 3 * hold)
                try await settle(lone, output: 30)
                #expect(try await h.scalar(userRow(2)) == 130)
                #expect(try await h.scalar(userRow(0)) == hold)
                #expect(try await h.scalar(companyRow) == 2 * hold + 130)

                // A batch applies every one: user 0's row (in it) and user 1's (not in it), and the company's.
                var open = await admit([0, 2])
                #expect(open.map { $0?.decision } == ["charged", "charged"])
                #expect(try await h.scalar(userRow(0)) == 120 + hold)
                #expect(try await h.scalar(userRow(1)) == 120)
                #expect(try await h.scalar(userRow(2)) == 130 + hold)
                #expect(try await h.scalar(companyRow) == 240 + 130 + 2 * hold)

                // A batch the server rolls back (a NUL byte in a text) hands them back: applied once, by the next.
                let later = await admit([1, 2])
                try await settle(later, output: 5)
                var bad = Self.call(users[0])
                bad.request.requestID = "req_\u{0}"
                let retried = await MeteringStore.admitBatch([Self.call(users[2]), bad], database: database, relaxed: false, slotEnds: ends)
                #expect(retried.count == 2)
                open.append(try? retried[0].get())
                #expect(try await h.scalar(userRow(1)) == 120 + hold)
                let again = await admit([0, 2])
                #expect(again.allSatisfy { $0?.decision == "charged" })
                open += again
                #expect(try await h.scalar(userRow(1)) == 120 + 105)

                // Without an admission: written by the gather's own transaction (here, its flush).
                #expect(open.count == 5 && open.allSatisfy { $0?.decision == "charged" })
                try await settle(open, output: 1)
                #expect(try await h.scalar(companyRow) > (try await h.scalar("SELECT sum(rate_tokens) FROM usage_ledger")))
                await ends.flush()
                // Every window row now holds exactly what its calls took.
                for i in 0..<3 { #expect(try await h.scalar(userRow(i)) == (try await h.scalar(ledger(i)))) }
                #expect(try await h.scalar(companyRow) == (try await h.scalar("SELECT sum(rate_tokens) FROM usage_ledger")))
                #expect(await ends.take().giveBacks.isEmpty)
            }
        }
    }
}
