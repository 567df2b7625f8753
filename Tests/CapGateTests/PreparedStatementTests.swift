import Foundation
import Testing

/// PostgresNIO keeps a prepared statement whose preparation failed as failed for its
/// connection's life: a function missing for a moment (a deploy dropping and creating it
/// outside one transaction) would otherwise fail every later call on the connections that tried
/// to prepare it then. CapGate closes such a connection (``Database/spoilsPreparedStatements(_:)``).
@Suite("Prepared statements after a failed preparation", .timeLimit(.minutes(5)))
struct PreparedStatementTests {
    /// `callers` concurrent calls, each with an Idempotency-Key of its own (each its own
    /// transaction, so the pool opens connections for them): their statuses.
    static func keyedCalls(_ h: Harness, keys: [String], callers: Int) async throws -> [Int] {
        try await withThrowingTaskGroup(of: Int.self) { group in
            for caller in 0..<callers {
                group.addTask {
                    try await h.message(
                        key: keys[caller % keys.count], headers: [("idempotency-key", "prepared-\(UUID().uuidString)")]
                    ).status
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
    }

    @Test(
        "capgate_admit_idempotent missing for a moment under 32 callers, then back: every call after it succeeds, and served == charged"
    )
    func functionMissingForAMoment() async throws {
        try await Harness.with { h in
            try await h.createPlan("big", company: 1_000_000, user: 1_000_000)
            let (_, users) = try await h.createCompany(plan: "big", users: 4)
            let keys = users.map(\.key)
            #expect(try await Self.keyedCalls(h, keys: keys, callers: 4) == [200, 200, 200, 200])

            try await h.exec("ALTER FUNCTION capgate_admit_idempotent RENAME TO capgate_admit_idempotent_away")
            let during = try await Self.keyedCalls(h, keys: keys, callers: 32)
            #expect(!during.contains(200), "\(during)")
            #expect(!during.contains(0))
            try await h.exec("ALTER FUNCTION capgate_admit_idempotent_away RENAME TO capgate_admit_idempotent")

            var after: [Int] = []
            for _ in 0..<3 { after += try await Self.keyedCalls(h, keys: keys, callers: 32) }
            #expect(
                after.allSatisfy { $0 == 200 },
                "statuses after the function came back: \(Dictionary(grouping: after) { $0 }.mapValues(\.count))")
            #expect(
                try await h.eventually("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'", equals: Int64(h.mock.served.count))
                    == Int64(h.mock.served.count))
        }
    }
}
