import CapGate
import CapGateDev
import Foundation
import Logging
import PostgresNIO

#if canImport(Glibc)
    import Glibc
#endif

/// One throwaway PostgreSQL cluster per test process, started through the same code as
/// `capgate dev`; every suite gets a database of its own in it.
enum TestCluster {
    static let logger: Logger = {
        var logger = Logger(label: "capgate-tests")
        logger.logLevel = ProcessInfo.processInfo.environment["CAPGATE_TEST_LOG"] == nil ? .critical : .debug
        return logger
    }()

    /// `max_connections` 1,200: every suite runs at once, each with a gateway's pool (12) and a
    /// client of its own (4), some with two gateways; 600 ran out once the suites grew.
    static let shared: Result<EmbeddedPostgres, any Error> = Result {
        let folder = NSTemporaryDirectory() + "capgate-tests-\(getpid())"
        let cluster = try EmbeddedPostgres.start(
            directory: folder,
            settings: ["fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "1200"],
            logger: logger
        )
        clusterForExit = cluster
        atexit {
            clusterForExit?.stop()
            if let data = clusterForExit?.dataDirectory {
                try? FileManager.default.removeItem(atPath: URL(fileURLWithPath: data).deletingLastPathComponent().path)
            }
        }
        return cluster
    }

    nonisolated(unsafe) static var clusterForExit: EmbeddedPostgres?

    /// The database every ``freshDatabase()`` copies: migrated once per test process instead of
    /// once per database (over 200 migrations a run, each hundreds of statements). Nobody
    /// connects to it after its migration (a copy needs the template without sessions).
    static let template = Task<String, any Error> {
        let name = "template_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(16)
        let url = try await offPool { try shared.get().createDatabase(String(name)) }
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        return String(name)
    }

    /// A new, migrated database: a copy of ``template`` (`CREATE DATABASE … TEMPLATE`).
    static func freshDatabase() async throws -> DatabaseURL {
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(16)
        let template = try await template.value
        return try await offPool { try shared.get().createDatabase(String(name), template: template) }
    }
}

/// Runs blocking work (process spawning and waiting) on a thread of its own, so it never holds
/// one of the few cooperative threads that also serve the gateways under test.
func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}
