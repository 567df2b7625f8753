import Crypto
import Foundation
import Logging
import PostgresNIO

/// Applies `db/migrations/*.sql` (built into the binary) in name order, each once, inside a
/// transaction, recorded in `capgate_migrations` with its checksum, under a session advisory lock so that two runners
/// never collide. A file changed after it was applied is an error, never silently skipped.
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

        public var description: String {
            switch self {
            case .folderMissing(let path): "migrations folder not found: \(path)"
            case .changedAfterApplied(let v): "migration \(v) was changed after it was applied; write a new migration instead"
            case .unknownApplied(let v): "the database has migration \(v) applied, which this build does not have"
            case .failed(let v, let why): "migration \(v) failed: \(why)"
            }
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
    /// database as an earlier release left it, for tests of an upgrade. (The functions are
    /// today's: the test makes sure the ones it calls hold for that schema.)
    func through(_ version: String) -> Migrator {
        Migrator(migrations: migrations.filter { String($0.version.prefix(version.count)) <= version }, functions: functions)
    }

    static func checksum(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    static let lockKey: Int64 = 0x4361_7047_6174_6501  // "CapGate" + 1

    /// The versions not applied yet, then ``FunctionSet/name`` when the functions differ from
    /// the applied ones. Throws when an applied file changed. Changes nothing (a database never
    /// migrated has everything pending).
    public func pending(client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in
            let table = try await connection.query("SELECT to_regclass('capgate_migrations') IS NOT NULL", logger: logger)
                .decode(Bool.self).collect()
            let migrations = table.first == true ? try await pending(connection, logger: logger) : migrations
            var names = migrations.map(\.version)
            if let functions, try await !functions.isApplied(connection, logger: logger) {
                names.append(FunctionSet.name)
            }
            return names
        }
    }

    /// Applies what is pending and returns the versions applied.
    @discardableResult
    public func migrate(client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in
            try await connection.query("SELECT pg_advisory_lock(\(Self.lockKey))", logger: logger)
            do {
                try await ensureTable(connection, logger: logger)
                var applied: [String] = []
                for migration in try await pending(connection, logger: logger) {
                    logger.info("applying migration", metadata: ["version": "\(migration.version)"])
                    try await connection.query("BEGIN", logger: logger)
                    do {
                        for statement in SQLSplitter.statements(in: migration.sql) {
                            try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
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
                    applied.append(migration.version)
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

    private func pending(_ connection: PostgresConnection, logger: Logger) async throws -> [Migration] {
        var applied: [String: String] = [:]
        for try await (version, checksum) in try await connection.query(
            "SELECT version, checksum FROM capgate_migrations", logger: logger
        ).decode((String, String).self) {
            applied[version] = checksum
        }
        for migration in migrations {
            if let checksum = applied[migration.version], checksum != migration.checksum {
                throw MigrationError.changedAfterApplied(migration.version)
            }
        }
        let known = Set(migrations.map(\.version))
        if let unknown = applied.keys.sorted().first(where: { !known.contains($0) }) {
            throw MigrationError.unknownApplied(unknown)
        }
        return migrations.filter { applied[$0.version] == nil }
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
