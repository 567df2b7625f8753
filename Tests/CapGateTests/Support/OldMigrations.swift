import CapGateDev
import Foundation

@testable import CapGate

/// The migrations 0001 to 0029 as they were before the baseline (`db/migrations/0030_baseline.sql`
/// stands for them; issue #48 item 5), kept in `Tests/CapGateTests/Fixtures/migrations/` for the
/// tests of upgrades from the databases they made. Read from the checkout; the product never
/// carries them.
enum OldMigrations {
    static let folder = SDKTests.root.appendingPathComponent("Tests/CapGateTests/Fixtures/migrations").path

    /// The old migrations alone: each makes the functions of its time, as it did.
    static func files() throws -> Migrator {
        try Migrator(folder: folder)
    }

    /// The old migrations with today's functions (`db/functions/`, as they were when 0029 was the
    /// last migration), applied after them as a release did; ``Migrator/through(_:)`` gives an
    /// earlier release's schema (the functions a test calls on it must hold for that schema).
    static func withFunctions() throws -> Migrator {
        Migrator(migrations: try files().migrations, functions: Migrator().functions)
    }

    /// `pg_dump --schema-only` of the database at `url`, without the lines that change from one
    /// run to the next (the \restrict key of pg_dump 15.14 and later).
    static func schema(_ url: DatabaseURL) async throws -> String {
        let dump = try await ChildProcess.run(
            try TestCluster.shared.get().binDirectory + "/pg_dump",
            [
                "--schema-only", "--no-owner", "--no-privileges", "--host", url.host, "--port", String(url.port),
                "--username", url.username, "--dbname", url.database,
            ],
            environment: ["PGPASSWORD": url.password ?? "", "PATH": "/usr/bin:/bin"], errors: .capture, name: "pg_dump",
            timeout: .seconds(120))
        guard dump.status == 0 else {
            throw DumpFailed(message: String(decoding: dump.errors, as: UTF8.self))
        }
        return dump.outputText.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !$0.hasPrefix("\\restrict") && !$0.hasPrefix("\\unrestrict") }
            .joined(separator: "\n")
    }

    struct DumpFailed: Error {
        var message: String
    }
}
