import CapGate
import CapGateDev
import Foundation
import NIOCore
import PostgresNIO
import Synchronization
import Testing

@Suite("Migrations, configuration and period math", .timeLimit(.minutes(5)))
struct FoundationTests {
    @Test(
        "migrations apply once, in order (a new database: the baseline, then the functions); a second run does nothing; dry run lists and creates nothing; a changed file is an error"
    )
    func migrations() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("m_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        #expect(
            try await CapGateRunner.migrate(url: url, dryRun: true, logger: logger) == [
                "would apply 0030_baseline", "would apply db/functions",
            ])
        // The dry run changed nothing, not even the bookkeeping table.
        let tables = try await CapGateRunner.withClient(url: url, logger: logger) { client in
            try await client.query("SELECT count(*)::int8 FROM pg_tables WHERE schemaname = 'public'", logger: logger).decode(Int64.self)
                .collect()
        }
        #expect(tables == [0])
        #expect(
            try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger) == [
                "applied 0030_baseline", "applied db/functions",
            ])
        #expect(try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger) == ["nothing to apply"])
        #expect(try await CapGateRunner.migrate(url: url, dryRun: true, logger: logger) == ["nothing to apply"])

        // A copy of the migrations with one file edited after it was applied.
        let folder = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let source = SDKTests.root.appendingPathComponent("db/migrations").path
        for name in try FileManager.default.contentsOfDirectory(atPath: source) where name.hasSuffix(".sql") {
            var text = try String(contentsOfFile: source + "/" + name, encoding: .utf8)
            if name.hasPrefix("0030") { text += "\n-- edited\n" }
            try text.write(toFile: folder + "/" + name, atomically: true, encoding: .utf8)
        }
        let edited = try Migrator(folder: folder)
        await #expect(throws: Migrator.MigrationError.self) {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await edited.migrate(client: client, logger: logger)
            }
        }
    }

    @Test(
        "db/functions: an edited file re-applies the set; a file removed takes its function away; a function file that fails changes nothing"
    )
    func functionFiles() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("f_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        // A copy of db/ whose functions are edited.
        let root = NSTemporaryDirectory() + "db-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let source = SDKTests.root.appendingPathComponent("db").path
        try FileManager.default.copyItem(atPath: source, toPath: root)
        func migrate() async throws -> [String] {
            let migrator = try Migrator(folder: root + "/migrations")
            return try await CapGateRunner.withClient(url: url, logger: logger) { try await migrator.migrate(client: $0, logger: logger) }
        }
        func scalar(_ sql: String) async throws -> String? {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String?.self).collect().first ?? nil
            }
        }
        #expect(try await migrate() == [])
        let probe = root + "/functions/capgate_probe.sql"
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT 'one' $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT capgate_probe()") == "one")
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT 'two' $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT capgate_probe()") == "two")
        #expect(try await migrate() == [])
        // A broken file: the whole set is rolled back, the old functions stay.
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT nope $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        await #expect(throws: Migrator.MigrationError.self) { try await migrate() }
        #expect(try await scalar("SELECT capgate_probe()") == "two")
        #expect(
            try await scalar(
                "SELECT to_regprocedure('capgate_charge(uuid,uuid,integer,text,text,text,text,text,bigint,timestamptz,text[],bigint,bigint,smallint,bigint,bigint[])')::text"
            )
                != nil)
        try FileManager.default.removeItem(atPath: probe)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT to_regprocedure('capgate_probe()')::text") == nil)
        #expect(
            try await scalar(
                "SELECT to_regprocedure('capgate_charge(uuid,uuid,integer,text,text,text,text,text,bigint,timestamptz,text[],bigint,bigint,smallint,bigint,bigint[])')::text"
            )
                != nil)
    }

    @Test(
        "withDeadline: a quick body's value or error passes through; a slow body is answered at the limit, even one that ignores cancellation, and its late outcome is reported"
    )
    func deadline() async throws {
        struct Refused: Error {}
        #expect(try await withDeadline(.seconds(5)) { 42 } == 42)
        await #expect(throws: Refused.self) { try await withDeadline(.seconds(5)) { () async throws -> Int in throw Refused() } }
        let start = ContinuousClock.now
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(100)) { () async throws -> Int in
                try await Task.sleep(for: .seconds(30))
                return 1
            }
        }
        let waited = ContinuousClock.now - start
        #expect(waited >= .milliseconds(100) && waited < .seconds(5))

        // A body that ignores cancellation (as a PostgresNIO query in progress does): the caller
        // is answered at the limit, the body runs on, and its outcome reaches lateResult.
        let gate = Gate()
        let stubborn: @Sendable () async throws -> Int = {
            await withCheckedContinuation { gate.wait($0) }
            return 7
        }
        let (lateResults, late) = AsyncStream.makeStream(of: Result<Int, any Error>.self)
        let abandoned = ContinuousClock.now
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(100), lateResult: { late.yield($0) }, stubborn)
        }
        #expect(ContinuousClock.now - abandoned < .seconds(5))
        gate.open()
        var lateIterator = lateResults.makeAsyncIterator()
        #expect(try await lateIterator.next()?.get() == 7)

        // In time, lateResult is not called.
        let (onTimeResults, onTime) = AsyncStream.makeStream(of: Result<Int, any Error>.self)
        #expect(try await withDeadline(.seconds(5), lateResult: { onTime.yield($0) }) { 42 } == 42)
        onTime.finish()
        var onTimeIterator = onTimeResults.makeAsyncIterator()
        #expect(await onTimeIterator.next() == nil)
    }

    /// A wait that cancellation does not end: only ``open()`` does.
    final class Gate: Sendable {
        private let state = Mutex<(open: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

        func wait(_ continuation: CheckedContinuation<Void, Never>) {
            let open = state.withLock { state -> Bool in
                if !state.open { state.waiter = continuation }
                return state.open
            }
            if open { continuation.resume() }
        }

        func open() {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.open = true
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }
    }

    @Test("a cluster folder the postgres user cannot reach (a mode-700 checkout run as root) still gets a working cluster")
    func unreachableFolder() async throws {
        let root = NSTemporaryDirectory() + "capgate-private-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: root) }
        let cluster = try await offPool {
            try EmbeddedPostgres.start(directory: root + "/pg", settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: URL(fileURLWithPath: cluster.dataDirectory).deletingLastPathComponent().path)
        }
        let lines = try await CapGateRunner.migrate(url: cluster.url, dryRun: true, logger: TestCluster.logger)
        #expect(lines.first == "would apply 0030_baseline")
    }

    @Test("a folder holding a cluster CapGate did not make (no password file) is refused and left as it is, not initialised again")
    func foreignCluster() async throws {
        let root = NSTemporaryDirectory() + "capgate-foreign-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        try FileManager.default.createDirectory(atPath: root + "/data", withIntermediateDirectories: true)
        try "15\n".write(toFile: root + "/data/PG_VERSION", atomically: true, encoding: .utf8)
        try "theirs".write(toFile: root + "/data/their-file", atomically: true, encoding: .utf8)
        let refused = try await offPool { () -> (any Error)? in
            do {
                _ = try EmbeddedPostgres.start(directory: root, settings: ["fsync": "off"], logger: TestCluster.logger)
                return nil
            } catch { return error }
        }
        #expect("\(refused.map(String.init(describing:)) ?? "started")".contains("did not make"))
        #expect(FileManager.default.fileExists(atPath: root + "/data/their-file"))
        #expect(!FileManager.default.fileExists(atPath: root + "/password"))
    }

    @Test("two migrators at once: each file applied exactly once")
    func concurrentMigrate() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("m_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        async let a = CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        async let b = CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        let lines = try await a + b
        #expect(lines.filter { $0.hasPrefix("applied") }.count == Migrator().migrations.count + 1)
        #expect(lines.filter { $0 == "nothing to apply" }.count == 1)
    }
}
