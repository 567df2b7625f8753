import CapGate
import Foundation
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A primary with a synchronous streaming standby, both embedded (`capgate dev --replica`, the
/// failover tests): a commit is acknowledged only once the standby has it on disk, so promoting
/// the standby after the primary dies loses no acknowledged write.
///
/// The standby is made afresh (`pg_basebackup -R`) at every start, from the primary as it is
/// then: after a failover, the next start goes back to the old primary's data.
public final class EmbeddedReplicaSet: Sendable {
    public let primary: EmbeddedPostgres
    public let standby: EmbeddedPostgres

    /// The multi-host URL of the `capgate` database: primary first, then standby.
    public var url: DatabaseURL {
        primary.url.with(hosts: [.init(host: "127.0.0.1", port: primary.port), .init(host: "127.0.0.1", port: standby.port)])
    }

    init(primary: EmbeddedPostgres, standby: EmbeddedPostgres) {
        self.primary = primary
        self.standby = standby
    }

    /// Starts the primary in `directory/primary` and its standby in `directory/standby`.
    public static func start(directory: String, settings: [String: String] = [:], logger: Logger) throws -> EmbeddedReplicaSet {
        try start(primaryDirectory: directory + "/primary", standbyDirectory: directory + "/standby", settings: settings, logger: logger)
    }

    /// Starts (initialising when new) the primary, makes a standby of it, starts that, and
    /// waits until it replicates synchronously.
    /// - Parameter settings: extra `postgres -c` settings for both servers.
    public static func start(
        primaryDirectory: String, standbyDirectory: String, settings: [String: String] = [:], logger: Logger
    ) throws -> EmbeddedReplicaSet {
        var primarySettings = settings
        // Every commit waits for the standby (quoted: pg_ctl starts the server through a shell).
        primarySettings["synchronous_standby_names"] = "'*'"
        let primary = try EmbeddedPostgres.start(directory: primaryDirectory, settings: primarySettings, logger: logger)
        do {
            let standby = try EmbeddedPostgres.startStandby(of: primary, directory: standbyDirectory, settings: settings, logger: logger)
            let set = EmbeddedReplicaSet(primary: primary, standby: standby)
            do {
                try set.waitForSynchronousStandby()
            } catch {
                standby.stop()
                throw error
            }
            return set
        } catch {
            primary.stop()
            throw error
        }
    }

    /// Waits (up to 120 s) until the primary reports a synchronous, streaming standby. On a
    /// timeout the error carries what the primary saw of its standbys and the end of the
    /// standby's log, so a failure far from here can be read.
    func waitForSynchronousStandby() throws {
        let deadline = Date().addingTimeInterval(120)
        while true {
            let count = try? primary.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'")
            if count?.trimmingWhitespace() == "1" { return }
            guard Date() < deadline else {
                let seen = (try? primary.psql("SELECT application_name, state, sync_state FROM pg_stat_replication")) ?? "(no answer)"
                let logPath = URL(fileURLWithPath: standby.dataDirectory).deletingLastPathComponent().path + "/postgres.log"
                let log = ((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "(no log)").split(separator: "\n").suffix(20)
                throw EmbeddedPostgres.EmbeddedError.commandFailed(
                    "standby",
                    "did not start streaming synchronously within 120 s; pg_stat_replication: [\(seen.trimmingWhitespace())]; "
                        + "standby log:\n" + log.joined(separator: "\n"))
            }
            usleep(100_000)
        }
    }

    /// Stops both servers (fast shutdown; a server already gone is skipped).
    public func stop() {
        standby.stop()
        primary.stop()
    }
}

extension EmbeddedPostgres {
    /// A streaming standby of `primary` in `directory` (made afresh with `pg_basebackup -R`,
    /// connecting through the primary's socket), started on a port of its own.
    static func startStandby(
        of primary: EmbeddedPostgres, directory: String, settings: [String: String], logger: Logger
    ) throws -> EmbeddedPostgres {
        let fm = FileManager.default
        let asRoot = primary.asRoot
        let directory = try usableDirectory(directory, asRoot: asRoot, logger: logger)
        let data = directory + "/data"
        stopIfRunning(data: data, bin: primary.binDirectory, mode: "immediate", asRoot: asRoot)
        try? fm.removeItem(atPath: data)
        let passwordFile = directory + "/password"
        try primary.password.write(toFile: passwordFile, atomically: true, encoding: .utf8)
        chmod(passwordFile, 0o600)
        if asRoot { try chownToPostgres(directory) }
        try run(
            primary.binDirectory + "/pg_basebackup",
            [
                "-h", primary.dataDirectory, "-p", "\(primary.port)", "-U", "capgate", "-D", data, "-R", "-X", "stream",
                "-c", "fast", "--no-sync",
            ],
            asRoot: asRoot)
        if asRoot { try chownToPostgres(directory) }
        chmod(data, 0o700)
        let port = try freePort()
        let options = serverOptions(port: port, data: data, settings: settings)
        try run(
            primary.binDirectory + "/pg_ctl", ["-D", data, "-l", directory + "/postgres.log", "-o", options, "-w", "-t", "60", "start"],
            asRoot: asRoot)
        return EmbeddedPostgres(
            dataDirectory: data, port: port, password: primary.password, binDirectory: primary.binDirectory, asRoot: asRoot,
            options: options, logger: logger)
    }

    /// Runs one statement with `psql` on the `postgres` database and returns its unaligned output.
    @discardableResult
    public func psql(_ sql: String) throws -> String {
        try Self.run(
            binDirectory + "/psql", ["-h", dataDirectory, "-p", "\(port)", "-U", "capgate", "-d", "postgres", "-tAq", "-c", sql],
            asRoot: asRoot)
    }

    /// `kill -9` of the postmaster: the server dies as in a crash of its machine (its backends
    /// end when they notice), and nothing is written on the way out.
    public func killPostmaster() {
        guard let pid = postmasterPID else { return }
        #if canImport(Glibc)
            _ = Glibc.kill(pid, SIGKILL)
        #else
            _ = Darwin.kill(pid, SIGKILL)
        #endif
    }

    /// `pg_ctl promote`: a standby becomes a primary (waits until it accepts writes).
    public func promote() throws {
        try Self.run(binDirectory + "/pg_ctl", ["-D", dataDirectory, "-w", "-t", "60", "promote"], asRoot: asRoot)
    }
}
