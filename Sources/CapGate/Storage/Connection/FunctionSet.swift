import Foundation
import Logging
import PostgresNIO

/// The live SQL functions: `db/functions/*.sql`, one function (or composite type) a file, the
/// only place their text lives. Migrations change tables and data; these files are today's code.
///
/// Applied as one set, in one transaction, whenever any file's checksum differs from the ones
/// recorded in `capgate_functions` (so a deploy that edits `capgate_charge.sql` re-applies it):
/// 1. every `capgate_*` function and procedure of the schema is dropped, except trigger functions (triggers
///    depend on them; their files use `CREATE OR REPLACE`), then every `capgate_*` composite
///    type, so a function removed from the folder is gone and a changed signature or row type
///    never meets its old self;
/// 2. the files named `*.type.sql` run, then the others, each group in name order (PL/pgSQL
///    resolves the functions it calls when it runs, so their order does not matter beyond types
///    first);
/// 3. the checksums are recorded.
public struct FunctionSet: Sendable {
    public struct File: Sendable {
        public var name: String
        public var sql: String
        public var checksum: String
    }

    /// How a re-application is named in `capgate migrate`'s output and in `/readyz`'s count.
    public static let name = "db/functions"

    /// In the order they are applied.
    public let files: [File]

    /// The files `*.type.sql` first, then the others, each group in name order.
    init(files: [(name: String, text: String)]) {
        let types = files.filter { $0.name.hasSuffix(".type.sql") }.sorted { $0.name < $1.name }
        let others = files.filter { !$0.name.hasSuffix(".type.sql") }.sorted { $0.name < $1.name }
        self.files = (types + others).map { File(name: $0.name, sql: $0.text, checksum: Migrator.checksum($0.text)) }
    }

    /// The `.sql` files of `folder`; nil when it does not exist.
    init?(folder: String) throws {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return nil }
        self.init(
            files: try names.filter { $0.hasSuffix(".sql") }.map { name in
                (name, try String(contentsOfFile: folder + "/" + name, encoding: .utf8))
            })
    }

    /// Whether the database runs exactly these files.
    func isApplied(_ connection: PostgresConnection, logger: Logger) async throws -> Bool {
        let exists = try await connection.query("SELECT to_regclass('capgate_functions') IS NOT NULL", logger: logger)
            .decode(Bool.self).collect()
        guard exists.first == true else { return false }
        var applied: [String: String] = [:]
        for try await (name, checksum) in try await connection.query("SELECT name, checksum FROM capgate_functions", logger: logger)
            .decode((String, String).self)
        {
            applied[name] = checksum
        }
        return applied == Dictionary(uniqueKeysWithValues: files.map { ($0.name, $0.checksum) })
    }

    /// Drops and re-creates every function in one transaction (the caller holds the migration lock).
    func apply(_ connection: PostgresConnection, logger: Logger) async throws {
        logger.info("applying functions", metadata: ["files": "\(files.count)"])
        try await connection.query("BEGIN", logger: logger)
        do {
            try await connection.query(
                """
                CREATE TABLE IF NOT EXISTS capgate_functions (
                    name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())
                """, logger: logger)
            try await connection.query(PostgresQuery(unsafeSQL: Self.dropAll), logger: logger)
            for file in files {
                do {
                    for statement in SQLSplitter.statements(in: file.sql) {
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                } catch {
                    throw Migrator.MigrationError.failed("db/functions/" + file.name, Migrator.describe(error))
                }
            }
            try await connection.query("DELETE FROM capgate_functions", logger: logger)
            for file in files {
                try await connection.query(
                    "INSERT INTO capgate_functions (name, checksum) VALUES (\(file.name), \(file.checksum))", logger: logger)
            }
            try await connection.query("COMMIT", logger: logger)
        } catch {
            _ = try? await connection.query("ROLLBACK", logger: logger)
            throw error
        }
    }

    static let dropAll = """
        DO $$
        DECLARE
            o record;
        BEGIN
            FOR o IN SELECT p.oid::regprocedure AS signature
                       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = current_schema() AND p.proname LIKE 'capgate\\_%'
                        AND p.prorettype <> 'trigger'::regtype
            LOOP
                EXECUTE 'DROP ROUTINE ' || o.signature::text;
            END LOOP;
            FOR o IN SELECT t.oid::regtype AS type
                       FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace JOIN pg_class c ON c.oid = t.typrelid
                      WHERE n.nspname = current_schema() AND t.typname LIKE 'capgate\\_%' AND c.relkind = 'c'
            LOOP
                EXECUTE 'DROP TYPE ' || o.type::text;
            END LOOP;
        END;
        $$
        """
}
