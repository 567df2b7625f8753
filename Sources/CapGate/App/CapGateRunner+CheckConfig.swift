import Foundation
import Logging
import PostgresNIO

extension CapGateRunner {
    /// `capgate check-config`: what `serve` reads at its start, read the same way (the required
    /// keys, every file a key names, the spool's folder, the tokens' lengths), then the database:
    /// reachable, and its schema one this binary knows. Pending migrations are fine (`serve`
    /// applies them) and listed; a migration this binary does not have, or one changed after it
    /// was applied, is not. Throws ``ConfigurationError`` naming what is wrong (exit 2); returns
    /// the lines to print. The systemd unit runs it before `serve` (`ExecStartPre=`).
    public static func checkConfiguration(_ configuration: CapGateConfiguration, logger: Logger) async throws -> [String] {
        let url = try DatabaseURL(try configuration.require(configuration.database.url, key: "database.url"))
        _ = try configuration.require(configuration.upstream.url, key: "upstream.url")
        // The gateway's parts, built and not run: each reads and checks what its keys name.
        let parts = try await GatewayParts(configuration: configuration, logger: logger)
        try? await parts.upstream.shutdown()
        let pending: [String]
        do {
            pending = try await withDeadline(.milliseconds(Int64(configuration.database.timeout * 1000))) {
                try await withClient(url: url, logger: logger) { try await Migrator().pending(client: $0, logger: logger) }
            }
        } catch let error as Migrator.MigrationError {
            throw ConfigurationError(key: "database.url", problem: "names a database this binary cannot serve: \(error)")
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError(key: "database.url", problem: "could not be reached or read: \(Self.reason(error))")
        }
        var lines = ["configuration ok", "database reachable; its schema is this binary's"]
        if let notice = configuration.retentionNotice { lines.append("note: " + notice) }
        lines.append(
            pending.isEmpty
                ? "no migrations pending"
                : "pending (serve applies them at start): " + pending.joined(separator: ", "))
        return lines
    }

    /// Why a database could not be used, without the URL (it holds the password).
    static func reason(_ error: any Error) -> String {
        if let psql = error as? PSQLError {
            if let message = psql.serverInfo?[.message] { return message }
            if let underlying = psql.underlying { return String(describing: underlying) }
            return String(describing: psql.code)
        }
        if error is DeadlineExceeded { return "no connection within database.timeout (a host down, a wrong port, or a refused login)" }
        return String(describing: type(of: error))
    }
}
