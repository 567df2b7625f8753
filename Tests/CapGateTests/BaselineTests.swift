import CapGateDev
import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// Issue #48 item 5: `db/migrations/0030_baseline.sql` stands for the migrations 0001 to 0029. A
/// new database runs it; a database those migrations made records it without running it and ends
/// with the same schema (pg_dump's, byte for byte), its ledger intact; an older one is refused.
@Suite("Migrations: the baseline", .timeLimit(.minutes(5)))
struct BaselineTests {
    static let logger = TestCluster.logger

    /// An empty database of the tests' cluster (not the migrated template).
    static func emptyDatabase(_ prefix: String) async throws -> DatabaseURL {
        try await offPool { try TestCluster.shared.get().createDatabase(prefix + UUID().uuidString.prefix(8).lowercased()) }
    }

    /// The first lines where two dumps differ, for the failure message.
    static func difference(_ expected: String, _ actual: String) -> String {
        let (a, b) = (
            expected.split(separator: "\n", omittingEmptySubsequences: false),
            actual.split(separator: "\n", omittingEmptySubsequences: false)
        )
        guard
            let first = zip(a, b).enumerated().first(where: { $0.element.0 != $0.element.1 })?.offset
                ?? (a.count == b.count ? nil : min(a.count, b.count))
        else { return "no difference" }
        let range = max(0, first - 3)..<(first + 4)
        return "line \(first + 1): new database\n" + a[range.clamped(to: a.indices)].joined(separator: "\n")
            + "\n--- upgraded database\n" + b[range.clamped(to: b.indices)].joined(separator: "\n")
    }

    @Test(
        "a new database runs the baseline; one made by 0001 to 0029 (with the functions of its release, or only those its files made) records it without running it; all three have the same pg_dump schema; the upgraded ledger verifies clean and takes calls"
    )
    func upgradeIsTheNewSchema() async throws {
        let fresh = try await Self.emptyDatabase("bn_")
        #expect(
            try await CapGateRunner.migrate(url: fresh, dryRun: false, logger: Self.logger) == [
                "applied 0030_baseline", "applied db/functions",
            ])

        // A database as the last release before the baseline left it: 0001 to 0029, then its
        // functions; a company's calls charged, settled, refunded and left unsettled.
        let old = try await Self.emptyDatabase("bo_")
        let (company, user) = (UUID(), UUID())
        let ids = try await CapGateRunner.withClient(url: old, logger: Self.logger) { client -> [Int64] in
            let applied = try await OldMigrations.withFunctions().migrate(client: client, logger: Self.logger)
            #expect(applied.first == "0001_schema" && applied.dropLast().last == Migrator.Baseline.replaces, "\(applied)")
            #expect(applied.count == 30 && applied.last == FunctionSet.name, "\(applied)")
            let now = Date()
            try await LedgerPartitionTests.seed(
                client, company: company, user: user, bounds: [LedgerPartitionTests.month(now), LedgerPartitionTests.month(now, plus: 1)])
            var ids: [Int64] = []
            for n in 0..<4 {
                ids.append(try await LedgerPartitionTests.charge(client, company, user, request: "old-\(n)", at: now))
            }
            try await LedgerPartitionTests.settle(client, company, [ids[0], ids[1]])
            #expect(try await LedgerPartitionTests.strings(client, "SELECT capgate_refund(\(company), \(ids[2]), 500)::text") == ["true"])
            return ids
        }
        let ledger = "SELECT l::text FROM usage_ledger l ORDER BY id"
        let before = try await CapGateRunner.withClient(url: old, logger: Self.logger) {
            try await LedgerPartitionTests.strings($0, PostgresQuery(unsafeSQL: ledger))
        }
        #expect(
            try await CapGateRunner.migrate(url: old, dryRun: true, logger: Self.logger) == ["would apply " + Migrator.Baseline.recorded])
        #expect(try await CapGateRunner.migrate(url: old, dryRun: false, logger: Self.logger) == ["applied " + Migrator.Baseline.recorded])
        #expect(try await CapGateRunner.migrate(url: old, dryRun: false, logger: Self.logger) == ["nothing to apply"])
        #expect(try await CapGateRunner.verify(url: old, logger: Self.logger).isEmpty)
        try await CapGateRunner.withClient(url: old, logger: Self.logger) { client in
            #expect(try await LedgerPartitionTests.strings(client, PostgresQuery(unsafeSQL: ledger)) == before)
            // The old migrations' rows stay as history, beside the baseline's.
            #expect(
                try await LedgerPartitionTests.strings(
                    client, "SELECT count(*)::text || ' ' || max(version) FROM capgate_migrations")
                    == ["30 0030_baseline"])
            // The upgraded database takes calls on: the next id, counted and verified.
            let next = try await LedgerPartitionTests.charge(client, company, user, request: "new", at: Date())
            #expect(next == ids.max()! + 1)
            try await LedgerPartitionTests.settle(client, company, [next])
        }
        #expect(try await CapGateRunner.verify(url: old, logger: Self.logger).isEmpty)

        // A database of 0001 to 0029 holding only the functions those files made: the baseline is
        // recorded and the function set replaces them.
        let bare = try await Self.emptyDatabase("bb_")
        try await CapGateRunner.withClient(url: bare, logger: Self.logger) { client in
            _ = try await OldMigrations.files().migrate(client: client, logger: Self.logger)
        }
        #expect(
            try await CapGateRunner.migrate(url: bare, dryRun: false, logger: Self.logger) == [
                "applied " + Migrator.Baseline.recorded, "applied db/functions",
            ])

        let expected = try await OldMigrations.schema(fresh)
        #expect(expected.contains("CREATE TABLE public.usage_ledger (") && expected.contains("CREATE FUNCTION public.ledger_rollup_part("))
        let upgraded = try await OldMigrations.schema(old)
        #expect(upgraded == expected, "\(Self.difference(expected, upgraded))")
        let bareSchema = try await OldMigrations.schema(bare)
        #expect(bareSchema == expected, "\(Self.difference(expected, bareSchema))")
    }

    @Test(
        "a database at an older migration (0025) is refused, naming its migration, the baseline's and the build that upgrades it, and left as it was; once the old migrations bring it to 0029 the baseline is recorded"
    )
    func olderIsRefused() async throws {
        let url = try await Self.emptyDatabase("br_")
        try await CapGateRunner.withClient(url: url, logger: Self.logger) { client in
            _ = try await OldMigrations.files().through("0025").migrate(client: client, logger: Self.logger)
        }
        for dryRun in [true, false] {
            do {
                let lines = try await CapGateRunner.migrate(url: url, dryRun: dryRun, logger: Self.logger)
                Issue.record("a database of 0025 was taken: \(lines)")
            } catch let error as Migrator.MigrationError {
                guard case .tooOld(let version) = error else {
                    Issue.record("not tooOld: \(error)")
                    continue
                }
                #expect(version == "0025_ledger_exports")
                let text = error.description
                #expect(
                    text.contains("0025_ledger_exports") && text.contains("0030_baseline") && text.contains("0029_rollup_unsettled"),
                    "\(text)")
                #expect(text.contains("commit " + Migrator.Baseline.lastCommitBefore), "\(text)")
            }
        }
        try await CapGateRunner.withClient(url: url, logger: Self.logger) { client in
            #expect(
                try await LedgerPartitionTests.strings(client, "SELECT max(version) FROM capgate_migrations") == ["0025_ledger_exports"])
            #expect(
                try await LedgerPartitionTests.strings(client, "SELECT relkind::text FROM pg_class WHERE oid = 'usage_ledger'::regclass")
                    == ["r"])
            // The build before the baseline takes it to 0029; this one then records the baseline.
            let applied = try await OldMigrations.files().migrate(client: client, logger: Self.logger)
            #expect(applied == ["0026_ledger_partitions", "0027_ledger_retention", "0028_ledger_rollups", "0029_rollup_unsettled"])
        }
        #expect(
            try await CapGateRunner.migrate(url: url, dryRun: false, logger: Self.logger) == [
                "applied " + Migrator.Baseline.recorded, "applied db/functions",
            ])
        #expect(try await CapGateRunner.verify(url: url, logger: Self.logger).isEmpty)
    }
}
