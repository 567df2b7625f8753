import Crypto
import Foundation
import Logging
import PostgresNIO

/// Applies `db/migrations/*.sql` (built into the binary) in name order, each once, inside a
/// transaction, recorded in `capgate_migrations` with its checksum, under a session advisory lock so that two runners
/// never collide. A file changed after it was applied is an error, never silently skipped.
///
/// The first file is the baseline (``Baseline``): the schema of the migrations before it, which are
/// no longer shipped. A new database runs it; a database those migrations made has it recorded
/// without running it; a database at an older migration is refused (``MigrationError/tooOld(_:)``).
///
/// Then the live SQL functions, `db/functions/*.sql` (one file each; see ``FunctionSet``): when
/// any file's checksum differs from the one recorded in `capgate_functions`, the whole set is
/// applied again in one transaction.
public struct Migrator: Sendable {
    /// One migration file.
    public struct Migration: Sendable {
        public var version: String
        public var sql: String
        public var checksum: String
    }

    public enum MigrationError: Error, CustomStringConvertible {
        case folderMissing(String)
        case changedAfterApplied(String)
        case unknownApplied(String)
        case failed(String, String)
        /// The database's last migration (named) is older than ``Baseline/replaces``: this build
        /// cannot bring it to the baseline's schema.
        case tooOld(String)

        public var description: String {
            switch self {
            case .folderMissing(let path): "migrations folder not found: \(path)"
            case .changedAfterApplied(let v): "migration \(v) was changed after it was applied; write a new migration instead"
            case .unknownApplied(let v): "the database has migration \(v) applied, which this build does not have"
            case .failed(let v, let why): "migration \(v) failed: \(why)"
            case .tooOld(let v):
                "the database is at migration \(v), older than this build can upgrade: it starts from \(Baseline.version), "
                    + "the schema of the migrations up to \(Baseline.replaces). Migrate it first with a CapGate built from "
                    + "commit \(Baseline.lastCommitBefore) (the last before the baseline; it applies the migrations up to "
                    + "\(Baseline.replaces) one by one), then with this build (docs/migrations.md)"
            }
        }
    }

    /// The migration that stands for every migration before it (issue #48 item 5: 0001 to 0029,
    /// squashed into one file; the old files are in the git history and, for the upgrade tests,
    /// in `Tests/CapGateTests/Fixtures/migrations/`).
    ///
    /// - A database with no migration applied runs it, as any migration.
    /// - A database whose migrations include ``replaces`` has its schema already (a test compares
    ///   the two): the baseline is recorded without running. Its rows of the old migrations stay
    ///   in `capgate_migrations`, as history; no check reads them any more.
    /// - A database at an older migration is refused (``MigrationError/tooOld(_:)``).
    public enum Baseline {
        /// The baseline's version: `db/migrations/0030_baseline.sql`.
        public static let version = "0030_baseline"
        /// The last of the migrations it stands for.
        public static let replaces = "0029_rollup_unsettled"
        /// The last commit whose build has the migrations it stands for as files (main before the
        /// squash), the build that upgrades an older database to ``replaces``.
        public static let lastCommitBefore = "0272bab"

        /// How ``Migrator/pending(client:logger:)`` and ``Migrator/migrate(client:logger:)`` name
        /// the baseline when the database already has its schema: recorded, not run.
        public static let recorded = version + " (recorded, not run: the database was made by the migrations up to " + replaces + ")"

        /// Whether `other` is one of the migrations the baseline stands for (numbered before it).
        static func isReplaced(_ other: String) -> Bool {
            other.prefix(4) < version.prefix(4)
        }
    }

    public let migrations: [Migration]
    /// The live functions (nil: there are none, and they are left as they are).
    public let functions: FunctionSet?

    /// The migrations and functions this binary was built with (`db/` of its checkout,
    /// embedded at build time by the `EmbedResourcesPlugin`): the same from any working directory.
    public init() {
        let migrations = EmbeddedFiles.texts(in: "db/migrations", suffix: ".sql")
        self.migrations = migrations.map { Migration(name: $0.name, sql: $0.text) }
        functions = FunctionSet(files: EmbeddedFiles.texts(in: "db/functions", suffix: ".sql"))
    }

    /// Loads the migration files from `folder` and the function files from the `functions`
    /// folder beside it (tests that edit a copy).
    public init(folder path: String) throws {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else {
            throw MigrationError.folderMissing(path)
        }
        migrations = try names.filter { $0.hasSuffix(".sql") }.sorted().map { name in
            Migration(name: name, sql: try String(contentsOfFile: path + "/" + name, encoding: .utf8))
        }
        functions = try FunctionSet(folder: URL(fileURLWithPath: path).deletingLastPathComponent().appendingPathComponent("functions").path)
    }

    init(migrations: [Migration], functions: FunctionSet?) {
        self.migrations = migrations
        self.functions = functions
    }

    /// This migrator's migrations up to `version` (`0025`, or a whole name) and its functions: a
    /// database as an earlier release left it, for tests of an upgrade (with the migrations from
    /// before the baseline, `Tests/CapGateTests/Fixtures/migrations/`). When the functions are
    /// today's, the test makes sure the ones it calls hold for that schema.
    func through(_ version: String) -> Migrator {
        Migrator(migrations: migrations.filter { String($0.version.prefix(version.count)) <= version }, functions: functions)
    }

    static func checksum(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    static let lockKey: Int64 = 0x4361_7047_6174_6501  // "CapGate" + 1

    /// The versions not applied yet (the baseline as ``Baseline/recorded`` when the database has
    /// its schema already), then ``FunctionSet/name`` when the functions differ from the applied
    /// ones. Throws when an applied file changed, when the database has a migration this build
    /// does not have, or when it is older than the baseline can take. Changes nothing (a database
    /// never migrated has everything pending).
    public func pending(client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in
            let table = try await connection.query("SELECT to_regclass('capgate_migrations') IS NOT NULL", logger: logger)
                .decode(Bool.self).collect()
            let steps = table.first == true ? try await pending(connection, logger: logger) : migrations.map { Step.run($0) }
            var names = steps.map(\.name)
            if let functions, try await !functions.isApplied(connection, logger: logger) {
                names.append(FunctionSet.name)
            }
            return names
        }
    }

    /// Applies what is pending and returns the versions applied, named as in
    /// ``pending(client:logger:)``.
    @discardableResult
    public func migrate(client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in
            try await connection.query("SELECT pg_advisory_lock(\(Self.lockKey))", logger: logger)
            do {
                try await ensureTable(connection, logger: logger)
                var applied: [String] = []
                for step in try await pending(connection, logger: logger) {
                    let migration = step.migration
                    logger.info("applying migration", metadata: ["version": "\(step.name)"])
                    try await connection.query("BEGIN", logger: logger)
                    do {
                        if case .run = step {
                            for statement in SQLSplitter.statements(in: migration.sql) {
                                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                            }
                        }
                        try await connection.query(
                            "INSERT INTO capgate_migrations (version, checksum) VALUES (\(migration.version), \(migration.checksum))",
                            logger: logger
                        )
                        try await connection.query("COMMIT", logger: logger)
                    } catch {
                        _ = try? await connection.query("ROLLBACK", logger: logger)
                        throw MigrationError.failed(migration.version, Self.describe(error))
                    }
                    applied.append(step.name)
                }
                if let functions, try await !functions.isApplied(connection, logger: logger) {
                    try await functions.apply(connection, logger: logger)
                    applied.append(FunctionSet.name)
                }
                try await connection.query("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger)
                return applied
            } catch {
                _ = try? await connection.query("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger)
                throw error
            }
        }
    }

    private func ensureTable(_ connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            CREATE TABLE IF NOT EXISTS capgate_migrations (
                version text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())
            """,
            logger: logger
        )
    }

    /// What a run does with one migration not applied yet.
    enum Step {
        /// Its statements run, then it is recorded.
        case run(Migration)
        /// Only recorded: the baseline, on a database that has its schema.
        case record(Migration)

        var migration: Migration {
            switch self {
            case .run(let migration), .record(let migration): migration
            }
        }

        /// As ``Migrator/pending(client:logger:)`` lists it.
        var name: String {
            switch self {
            case .run(let migration): migration.version
            case .record: Baseline.recorded
            }
        }
    }

    private func pending(_ connection: PostgresConnection, logger: Logger) async throws -> [Step] {
        var applied: [String: String] = [:]
        for try await (version, checksum) in try await connection.query(
            "SELECT version, checksum FROM capgate_migrations", logger: logger
        ).decode((String, String).self) {
            applied[version] = checksum
        }
        return try Self.steps(migrations, applied: applied)
    }

    /// The steps that bring a database whose `capgate_migrations` holds `applied` (version:
    /// checksum) to `migrations`; throws when an applied file changed, when the database has a
    /// migration this build does not know, or when it is older than the baseline can take.
    static func steps(_ migrations: [Migration], applied: [String: String]) throws -> [Step] {
        for migration in migrations {
            if let checksum = applied[migration.version], checksum != migration.checksum {
                throw MigrationError.changedAfterApplied(migration.version)
            }
        }
        // With the baseline, the migrations it stands for are known without their files.
        let baseline = migrations.first { $0.version == Baseline.version }
        let known = Set(migrations.map(\.version))
        if let unknown = applied.keys.sorted().first(where: { !known.contains($0) && !(baseline != nil && Baseline.isReplaced($0)) }) {
            throw MigrationError.unknownApplied(unknown)
        }
        return try migrations.compactMap { migration in
            guard applied[migration.version] == nil else { return nil }
            guard migration.version == Baseline.version, !applied.isEmpty else { return .run(migration) }
            guard applied[Baseline.replaces] != nil else { throw MigrationError.tooOld(applied.keys.max() ?? "") }
            return .record(migration)
        }
    }

    static func describe(_ error: any Error) -> String {
        if let psql = error as? PSQLError, let message = psql.serverInfo?[.message] {
            return message
        }
        return String(reflecting: error)
    }
}

extension Migrator.Migration {
    /// The migration in file `name` (`NNNN_what.sql`).
    init(name: String, sql: String) {
        self.init(version: String(name.dropLast(4)), sql: sql, checksum: Migrator.checksum(sql))
    }
}
