import Foundation
import Hummingbird
import Logging
import PostgresNIO
import ServiceLifecycle

/// The bodies of the `capgate` subcommands, in the library so tests can drive them.
public enum CapGateRunner {
    /// `capgate serve`: migrates (under the advisory lock), then runs the gateway until SIGTERM/SIGINT.
    ///
    /// The log output runs first in the group, so it stops last and the gateway's final lines
    /// are written.
    public static func serve(configuration: CapGateConfiguration, logger: Logger) async throws {
        let url = try DatabaseURL(try configuration.require(configuration.database.url, key: "database.url"))
        // A bad certificate or key stops the start before the database is touched (read again,
        // to serve, by buildApplication).
        if let files = configuration.http.tls { _ = try ListenerTLS(files: files) }
        _ = try await migrate(url: url, dryRun: false, logger: logger)
        if let notice = configuration.retentionNotice { logger.info("\(notice)") }
        let app = try await buildApplication(configuration: configuration, logger: logger)
        let group = ServiceGroup(
            configuration: .init(services: [LogOutput.standardError, app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }

    /// Runs `body` with a short-lived client (for the one-shot commands).
    public static func withClient<T: Sendable>(
        url: DatabaseURL, logger: Logger, _ body: @escaping @Sendable (PostgresClient) async throws -> T
    ) async throws -> T {
        // The body may lease a connection before the child task has entered `run()`; the pool
        // then waits for it, but warns on its background logger at every start of `serve`.
        // Connection failures reach the body as errors, so that logger only needs errors.
        var poolLogger = logger
        poolLogger.logLevel = max(logger.logLevel, .error)
        // A multi-host URL: its host that accepts writes now (a single-host URL as it is).
        let url = try await url.writable(logger: logger)
        let client = PostgresClient(configuration: url.clientConfiguration(maxConnections: 4), backgroundLogger: poolLogger)
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                await client.run()
                return nil
            }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    /// `capgate migrate [--dry-run]`: the lines to print.
    public static func migrate(url: DatabaseURL, dryRun: Bool, logger: Logger) async throws -> [String] {
        let migrator = Migrator()
        return try await withClient(url: url, logger: logger) { client in
            if dryRun {
                let pending = try await migrator.pending(client: client, logger: logger)
                return pending.isEmpty ? ["nothing to apply"] : pending.map { "would apply \($0)" }
            }
            let applied = try await migrator.migrate(client: client, logger: logger)
            return applied.isEmpty ? ["nothing to apply"] : applied.map { "applied \($0)" }
        }
    }

    /// `capgate rollover [--at T] [--dry-run]`.
    /// With `retention` (`ledger.retentionMonths`) and not a dry run, the months past it are then
    /// dropped where they may be (``LedgerRetention/enforce(retention:now:)``, by the clock as the
    /// partitions are made); each refusal is in the summary.
    public static func rollover(
        url: DatabaseURL, at: Date, dryRun: Bool, retention: Int? = nil, logger: Logger
    ) async throws -> BillingStore.RolloverSummary {
        try await withClient(url: url, logger: logger) { client in
            let billing = BillingStore(database: Database(client: client, timeout: .seconds(3600), logger: logger))
            var summary = try await billing.rollover(at: at, dryRun: dryRun)
            if let retention, !dryRun, !summary.skippedLocked {
                let database = Database(client: client, timeout: LedgerExport.timeout, logger: logger)
                summary.retention = try await LedgerRetention(database: database).enforce(retention: retention)
            }
            return summary
        }
    }

    /// `capgate verify`.
    public static func verify(url: DatabaseURL, logger: Logger) async throws -> [BillingStore.Mismatch] {
        try await withClient(url: url, logger: logger) { client in
            try await BillingStore(database: Database(client: client, timeout: .seconds(3600), logger: logger)).verify()
        }
    }
}
