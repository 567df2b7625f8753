import CapGate
import Foundation
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A private PostgreSQL cluster started from the machine's PostgreSQL binaries: used by
/// `capgate dev` (under `.capgate/`) and by the tests (under a temporary folder).
///
/// It listens on 127.0.0.1 on a free port, keeps its socket inside the data folder, and runs
/// through `runuser -u postgres` when CapGate runs as root (initdb refuses root).
public final class EmbeddedPostgres: Sendable {
    public enum EmbeddedError: Error, CustomStringConvertible {
        case binariesMissing
        case commandFailed(String, String)
        /// The folder holds a cluster CapGate did not make (no password file of ours beside it).
        case foreignCluster(String)

        public var description: String {
            switch self {
            case .binariesMissing:
                "PostgreSQL binaries not found: install them with `apt-get update && apt-get install -y postgresql`, or set DATABASE_URL"
            case .commandFailed(let command, let output):
                "\(command) failed: \(output)"
            case .foreignCluster(let data):
                "\(data) holds a PostgreSQL cluster CapGate did not make (no password file beside it): it is left as it is; choose another folder, or remove this one to start afresh"
            }
        }
    }

    public let dataDirectory: String
    public let port: Int
    public let password: String
    public let binDirectory: String
    let asRoot: Bool
    /// The `postgres` options it was started with (a restart uses them again).
    let options: String
    let logger: Logger

    /// The URL of the `capgate` database in this cluster (with its password: never log it).
    public var url: DatabaseURL {
        DatabaseURL(host: "127.0.0.1", port: port, username: "capgate", password: password, database: "capgate")
    }

    /// Initialises (when new) and starts a cluster in `directory`.
    /// - Parameter settings: extra `postgres -c` settings (tests turn off fsync).
    public static func start(
        directory: String,
        settings: [String: String] = [:],
        logger: Logger
    ) throws -> EmbeddedPostgres {
        let bin = try findBinaries()
        let asRoot = getuid() == 0
        let fm = FileManager.default
        let directory = try usableDirectory(directory, asRoot: asRoot, logger: logger)
        let data = directory + "/data"
        let passwordFile = directory + "/password"
        let password: String
        let hasCluster = fm.fileExists(atPath: data + "/PG_VERSION")
        if let existing = try? String(contentsOfFile: passwordFile, encoding: .utf8), hasCluster {
            password = existing.trimmingWhitespace()
        } else {
            // A cluster without our password file is someone else's (or its password is lost):
            // never wiped. A data folder without PG_VERSION is an initdb of ours that broke off.
            guard !hasCluster else { throw EmbeddedError.foreignCluster(data) }
            try? fm.removeItem(atPath: data)
            password = ApiKeyGenerator.randomToken(bytes: 18)
            try password.write(toFile: passwordFile, atomically: true, encoding: .utf8)
            chmod(passwordFile, 0o600)
            let pwfile = directory + "/pwfile"
            try password.write(toFile: pwfile, atomically: true, encoding: .utf8)
            if asRoot { try chownToPostgres(directory) }
            defer { try? fm.removeItem(atPath: pwfile) }
            try run(
                bin + "/initdb",
                [
                    "-D", data, "-U", "capgate", "--pwfile=" + pwfile, "--auth-local=trust", "--auth-host=scram-sha-256",
                    "-E", "UTF8", "--locale=C", "--no-sync",
                ],
                asRoot: asRoot
            )
        }
        if asRoot { try chownToPostgres(directory) }
        // A cluster left running by an earlier run of ours in this folder is stopped first.
        stopIfRunning(data: data, bin: bin, mode: "fast", asRoot: asRoot)
        let port = try freePort()
        let options = serverOptions(port: port, data: data, settings: settings)
        try run(bin + "/pg_ctl", ["-D", data, "-l", directory + "/postgres.log", "-o", options, "-w", "-t", "60", "start"], asRoot: asRoot)
        let cluster = EmbeddedPostgres(
            dataDirectory: data, port: port, password: password, binDirectory: bin, asRoot: asRoot, options: options, logger: logger)
        // The capgate database (initdb made the capgate superuser). It commits without waiting
        // for a synchronous standby: a replica set's primary has none yet at this point.
        _ = try? run(
            bin + "/psql",
            [
                "-h", data, "-p", "\(port)", "-U", "capgate", "-d", "postgres", "-q", "-c", "SET synchronous_commit = local", "-c",
                "CREATE DATABASE capgate",
            ],
            asRoot: asRoot)
        return cluster
    }

    init(dataDirectory: String, port: Int, password: String, binDirectory: String, asRoot: Bool, options: String, logger: Logger) {
        self.dataDirectory = dataDirectory
        self.port = port
        self.password = password
        self.binDirectory = binDirectory
        self.asRoot = asRoot
        self.options = options
        self.logger = logger
    }

    /// The `postgres` options of a cluster: its port, the socket in the data folder, loopback
    /// only, and `settings` as `-c name=value`.
    static func serverOptions(port: Int, data: String, settings: [String: String]) -> String {
        var options = "-p \(port) -k \(data) -c listen_addresses=127.0.0.1 -c max_connections=300"
        for (key, value) in settings.sorted(by: { $0.key < $1.key }) { options += " -c \(key)=\(value)" }
        return options
    }

    /// Creates another database in this cluster (tests use one per suite).
    /// With `template`, a copy of that database (which nobody may be connected to).
    public func createDatabase(_ name: String, template: String? = nil) throws -> DatabaseURL {
        let statement = "CREATE DATABASE \"\(name)\"" + (template.map { " TEMPLATE \"\($0)\"" } ?? "")
        try Self.run(
            binDirectory + "/psql",
            ["-h", dataDirectory, "-p", "\(port)", "-U", "capgate", "-d", "postgres", "-q", "-c", statement],
            asRoot: asRoot)
        return DatabaseURL(host: "127.0.0.1", port: port, username: "capgate", password: password, database: name)
    }

    /// Stops the cluster (fast shutdown); a postmaster already gone is skipped (``postmasterPID``).
    public func stop() {
        Self.stopIfRunning(data: dataDirectory, bin: binDirectory, mode: "fast", asRoot: asRoot)
    }

    /// Stops the cluster immediately, as a crash would (tests of fail-closed behaviour).
    public func kill() {
        Self.stopIfRunning(data: dataDirectory, bin: binDirectory, mode: "immediate", asRoot: asRoot)
    }

    /// Starts it again on the same port (and settings) after ``stop()`` or ``kill()``.
    public func restart() throws {
        try Self.run(
            binDirectory + "/pg_ctl",
            ["-D", dataDirectory, "-l", dataDirectory + "/../postgres.log", "-o", options, "-w", "-t", "60", "start"], asRoot: asRoot)
    }

    /// `directory`, created; or, when CapGate runs as root and the `postgres` user cannot reach
    /// it (a checkout under /root or in a mode-700 folder), a folder under the temporary
    /// directory named after it, so the same checkout always finds its cluster again.
    static func usableDirectory(_ directory: String, asRoot: Bool, logger: Logger) throws -> String {
        let fm = FileManager.default
        try fm.createDirectory(atPath: directory, withIntermediateDirectories: true)
        guard asRoot else { return directory }
        try chownToPostgres(directory)
        if (try? run("/usr/bin/test", ["-w", directory, "-a", "-x", directory], asRoot: true)) != nil { return directory }
        let digest = ApiKeyGenerator.hash(URL(fileURLWithPath: directory).standardized.path).readableBytesView
            .prefix(8).map { String(format: "%02x", $0) }.joined()
        let fallback = NSTemporaryDirectory() + "capgate-postgres-" + digest
        logger.notice(
            "the postgres user cannot reach the cluster folder; using another",
            metadata: ["wanted": "\(directory)", "using": "\(fallback)"]
        )
        try fm.createDirectory(atPath: fallback, withIntermediateDirectories: true)
        return fallback
    }

    /// `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin` holding `initdb`.
    static func findBinaries() throws -> String {
        let fm = FileManager.default
        if let out = try? capture("/usr/bin/pg_config", ["--bindir"]) {
            let dir = out.trimmingWhitespace()
            if fm.isExecutableFile(atPath: dir + "/initdb") && fm.isExecutableFile(atPath: dir + "/pg_ctl") { return dir }
        }
        let root = "/usr/lib/postgresql"
        let versions = ((try? fm.contentsOfDirectory(atPath: root)) ?? []).compactMap { Int($0) }.sorted(by: >)
        for version in versions where fm.isExecutableFile(atPath: "\(root)/\(version)/bin/initdb") {
            return "\(root)/\(version)/bin"
        }
        throw EmbeddedError.binariesMissing
    }

    static func chownToPostgres(_ path: String) throws {
        try run("/bin/chown", ["-R", "postgres:postgres", path], asRoot: false)
        chmod(path, 0o700)
        if FileManager.default.fileExists(atPath: path + "/data") { chmod(path + "/data", 0o700) }
    }

    @discardableResult
    static func run(_ executable: String, _ arguments: [String], asRoot: Bool) throws -> String {
        if asRoot {
            // As `postgres`, started in `/` (`env -C`): the paths it is given are absolute, and a
            // working directory that user cannot enter (a checkout under a root-only `mktemp -d`)
            // made psql print "could not change directory" into the output a caller reads.
            return try capture(
                "/usr/sbin/runuser", ["-u", "postgres", "--", "/usr/bin/env", "-C", "/", executable] + arguments, name: executable)
        }
        return try capture(executable, arguments)
    }

    /// Runs a program and returns its output (with its errors); throws with the output when it
    /// fails. Through ``ChildProcess``: a server that `pg_ctl` starts holds none of our
    /// descriptors, and the wait is for `pg_ctl`'s own end, not for the end of its output.
    @discardableResult
    static func capture(_ executable: String, _ arguments: [String], name: String? = nil) throws -> String {
        let command = URL(fileURLWithPath: name ?? executable).lastPathComponent
        let child: ChildProcess
        do {
            child = try ChildProcess(executable, arguments, name: command)
        } catch {
            guard case .couldNotStart(_, let reason) = error else { throw error }
            throw EmbeddedError.commandFailed(executable, "could not start: \(reason)")
        }
        let status = child.waitUntilExit()
        let text = child.outputText
        guard status == 0 else { throw EmbeddedError.commandFailed(command, text.trimmingWhitespace()) }
        return text
    }
}
