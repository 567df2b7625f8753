import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// What migration 0021 carries when the plan's rate windows move from `rate_windows` rows into
/// the period counter rows (SPEC §14): a database upgraded mid-minute keeps counting the minute it
/// is in, forgets the minutes that are over, keeps a feature's windows where they were, and keeps
/// only the calls that hold a concurrency slot.
@Suite("Rate windows: the upgrade to counters in the period rows", .timeLimit(.minutes(5)))
struct RateMigrationTests {
    @Test(
        "migration 0021 carries the current minute's plan windows into the period's company and user counter rows, drops older minutes' and calls that hold no slot, and keeps a feature's rows"
    )
    func windowsIntoCounters() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("w_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        // The migrations up to 0020 (no functions), then windows and calls as that schema held them.
        let folder = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let source = OldMigrations.folder
        for name in try FileManager.default.contentsOfDirectory(atPath: source) where name.hasSuffix(".sql") && name < "0021" {
            try FileManager.default.copyItem(atPath: source + "/" + name, toPath: folder + "/" + name)
        }
        let old = try Migrator(folder: folder)
        _ = try await CapGateRunner.withClient(url: url, logger: logger) { try await old.migrate(client: $0, logger: logger) }
        func exec(_ sql: String) async throws {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                _ = try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).collect()
            }
        }
        func run(_ sql: String) async throws -> [String] {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String.self).collect()
            }
        }
        // Two companies on a period holding now; A's windows are of the next minute (a gateway
        // whose clock is ahead: still current however long the test takes to migrate), B's of one
        // that is over. A's users: u1 counted in the minute, u2 not at all.
        let (a, b, u1, u2, ub) = (UUID(), UUID(), UUID(), UUID(), UUID())
        for statement in Self.seed(a: a, b: b, u1: u1, u2: u2, ub: ub) {
            try await exec(statement)
        }

        // The old migrations from 0021 to 0029 (as the last build before the baseline did), then this
        // build's: the baseline recorded, the functions applied.
        _ = try await CapGateRunner.withClient(url: url, logger: logger) {
            try await OldMigrations.withFunctions().migrate(client: $0, logger: logger)
        }
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        let carried = "(rate_minute > now() - interval '1 minute')::text"
        // A's company row and u1's row carry the minute; u2 and company B start from nothing.
        #expect(
            try await run(
                """
                SELECT coalesce(\(carried), 'never') || ' ' || rate_calls || ' ' || rate_tokens
                  FROM company_usage ORDER BY company_id = '\(a.text)' DESC
                """) == ["true 7 700", "never 0 0"])
        #expect(
            try await run(
                """
                SELECT coalesce(\(carried), 'never') || ' ' || rate_calls || ' ' || rate_tokens
                  FROM user_usage ORDER BY user_id = '\(u1.text)' DESC, user_id = '\(u2.text)' DESC
                """) == ["true 3 300", "never 0 0", "never 0 0"])
        // Only the feature's window stays in rate_windows; only the call holding a slot stays.
        #expect(try await run("SELECT feature_id || ' ' || calls FROM rate_windows") == ["f 2"])
        #expect(try await run("SELECT ledger_id::text FROM rate_calls") == ["1"])
    }

    /// The 0020 schema's rows of the test: plan, companies, users, periods, counters, plan and
    /// feature windows, calls with and without a slot.
    static func seed(a: UUID, b: UUID, u1: UUID, u2: UUID, ub: UUID) -> [String] {
        let nil0 = "00000000-0000-0000-0000-000000000000"
        return [
            """
            INSERT INTO plans (id, name) VALUES ('p', 'P')
            """,
            """
            INSERT INTO companies (id, name) VALUES ('\(a.text)', 'A'), ('\(b.text)', 'B')
            """,
            """
            INSERT INTO users (company_id, id) VALUES ('\(a.text)', '\(u1.text)'), ('\(a.text)', '\(u2.text)'),
                ('\(b.text)', '\(ub.text)')
            """,
            """
            INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                SELECT c, 'p', now() - interval '1 day', now() + interval '1 day', now() - interval '1 day'
                FROM unnest(ARRAY['\(a.text)', '\(b.text)']::uuid[]) c
            """,
            """
            INSERT INTO company_usage (company_id, period_id, used) SELECT company_id, id, 0 FROM plan_periods
            """,
            """
            INSERT INTO user_usage (company_id, period_id, user_id, used)
                SELECT p.company_id, p.id, u.id, 0 FROM plan_periods p JOIN users u ON u.company_id = p.company_id
            """,
            """
            INSERT INTO rate_windows (company_id, user_id, feature_id, minute, calls, tokens) VALUES
                ('\(a.text)', '\(nil0)', '', date_trunc('minute', now(), 'UTC') + interval '1 minute', 7, 700),
                ('\(a.text)', '\(u1.text)', '', date_trunc('minute', now(), 'UTC') + interval '1 minute', 3, 300),
                ('\(a.text)', '\(u1.text)', 'f', date_trunc('minute', now(), 'UTC') + interval '1 minute', 2, 200),
                ('\(b.text)', '\(nil0)', '', date_trunc('minute', now(), 'UTC') - interval '5 minutes', 9, 900),
                ('\(b.text)', '\(ub.text)', '', date_trunc('minute', now(), 'UTC') - interval '5 minutes', 4, 400)
            """,
            """
            INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until) VALUES
                ('\(a.text)', 1, '\(u1.text)', '', now(), 100, 7, now() + interval '10 minutes'),
                ('\(a.text)', 2, '\(u1.text)', '', now(), 100, 3, now() + interval '10 minutes')
            """,
        ]
    }
}
