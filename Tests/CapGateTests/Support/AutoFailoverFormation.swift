import CapGate
import Foundation
import Synchronization

@testable import CapGateDev

#if canImport(Glibc)
    import Glibc
#endif

/// A pg_auto_failover formation of a test's own: a monitor and two nodes of one group, which
/// pg_auto_failover runs with synchronous replication, so a commit is acknowledged only once the
/// secondary has it. The gateway meets it as an operator's would: through the multi-host URL
/// that `pg_autoctl show uri` prints, and `pg_autoctl perform failover` moves the primary.
///
/// Everything runs as the `postgres` OS user when the tests run as root (initdb refuses root),
/// in a mode-700 folder with the XDG folders inside it, so pg_autoctl keeps its configuration,
/// state and pid files there rather than under that user's home or in `/tmp/pg_autoctl`. The
/// `pg_autoctl run` processes (the keepers, each starting its own PostgreSQL) are the test's:
/// their process ids are kept, and ``stop()`` signals those and nothing else.
final class AutoFailoverFormation: Sendable {
    /// A PostgreSQL instance of the formation: the monitor's or a node's.
    struct Instance: Sendable {
        var name: String
        var port: Int
        var pgdata: String
    }

    /// One node as the monitor reports it (`pg_autoctl show state --json`).
    struct NodeState: Decodable, Sendable {
        var nodename: String
        var nodeport: Int
        var current_group_state: String
        var assigned_group_state: String
    }

    let folder: String
    let monitor: Instance
    let nodes: [Instance]
    let executable: String
    let binDirectory: String
    let asRoot: Bool
    /// The `pg_autoctl run` processes this formation started, by the folder each serves.
    let keepers = Mutex<[String: pid_t]>([:])

    /// Where `pg_autoctl` is (beside the PostgreSQL binaries or on the PATH); nil when it is not
    /// installed (`apt-get install -y postgresql-15-auto-failover`).
    static let executablePath: String? = {
        let fm = FileManager.default
        var folders = ((try? EmbeddedPostgres.findBinaries()).map { [$0] } ?? [])
        folders += (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map(String.init)
        folders += ["/usr/bin", "/usr/local/bin"]
        return folders.map { $0 + "/pg_autoctl" }.first { fm.isExecutableFile(atPath: $0) }
    }()

    /// True when pg_autoctl and the PostgreSQL binaries it drives are installed.
    static var isInstalled: Bool { executablePath != nil && (try? EmbeddedPostgres.findBinaries()) != nil }

    init(folder: String, monitor: Instance, nodes: [Instance], executable: String, binDirectory: String, asRoot: Bool) {
        self.folder = folder
        self.monitor = monitor
        self.nodes = nodes
        self.executable = executable
        self.binDirectory = binDirectory
        self.asRoot = asRoot
    }

    /// Creates and runs a monitor and two nodes in a new folder `directory` (its `capgate`
    /// database made by pg_autoctl on the first node), and waits until the monitor reports a
    /// primary and a secondary. On a failure what was started is stopped again.
    static func start(directory: String) throws -> AutoFailoverFormation {
        guard let executable = executablePath else { throw EmbeddedPostgres.EmbeddedError.commandFailed("pg_autoctl", "not installed") }
        let bin = try EmbeddedPostgres.findBinaries()
        let asRoot = getuid() == 0
        let fm = FileManager.default
        for sub in ["config", "data", "run"] {
            try fm.createDirectory(atPath: directory + "/" + sub, withIntermediateDirectories: true)
        }
        if asRoot { try EmbeddedPostgres.chownToPostgres(directory) }
        for sub in ["", "/config", "/data", "/run"] { chmod(directory + sub, 0o700) }

        let monitor = Instance(name: "monitor", port: try EmbeddedPostgres.freePort(), pgdata: directory + "/monitor")
        let nodes = try (1...2).map { Instance(name: "node\($0)", port: try EmbeddedPostgres.freePort(), pgdata: directory + "/node\($0)") }
        let formation = AutoFailoverFormation(
            folder: directory, monitor: monitor, nodes: nodes, executable: executable, binDirectory: bin, asRoot: asRoot)
        do {
            try formation.ctl(["create", "monitor"] + formation.createOptions(monitor))
            try formation.tune(monitor)
            try formation.run(monitor)
            try formation.waitUntil("the monitor accepts connections") {
                (try? EmbeddedPostgres.capture(bin + "/pg_isready", ["-q", "-h", "127.0.0.1", "-p", "\(monitor.port)"])) != nil
            }
            let monitorURI = "postgres://autoctl_node@127.0.0.1:\(monitor.port)/pg_auto_failover?sslmode=disable"
            for (index, node) in nodes.enumerated() {
                // The second node is cloned from the first (pg_basebackup), which must be running
                // as the formation's single node by then.
                try formation.ctl(
                    ["create", "postgres"] + formation.createOptions(node)
                        + ["--name", node.name, "--dbname", "capgate", "--monitor", monitorURI])
                try formation.tune(node)
                try formation.run(node)
                if index == 0 {
                    try formation.waitUntil("\(node.name) runs as the single node") {
                        (try? formation.state())?.contains { $0.nodename == node.name && $0.current_group_state == "single" } == true
                    }
                }
            }
            try formation.waitForPrimaryAndSecondary()
        } catch {
            formation.stop()
            throw error
        }
        return formation
    }

    /// The options `pg_autoctl create monitor|postgres` share: loopback only, no TLS, trust (the
    /// folder and the ports are the test's own, on loopback), and the machine's `pg_ctl`.
    func createOptions(_ instance: Instance) -> [String] {
        [
            "--pgdata", instance.pgdata, "--pgport", "\(instance.port)", "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
            "--auth", "trust", "--no-ssl", "--pgctl", binDirectory + "/pg_ctl",
        ]
    }

    /// Settings appended to an instance's `postgresql.auto.conf` (read last, so they win over
    /// pg_autoctl's own): pg_autoctl sizes `shared_buffers` to a share of the machine's memory,
    /// several GB each, too much for three instances beside a test run; and, as in the other
    /// suites' clusters, no fsync (what is tested is a switch of primaries, not a power cut).
    func tune(_ instance: Instance) throws {
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: instance.pgdata + "/postgresql.auto.conf"))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("shared_buffers = '64MB'\nfsync = off\n".utf8))
    }

    /// Runs `pg_autoctl arguments` to its end (as `postgres` under root) with the formation's
    /// XDG folders, and returns its output.
    @discardableResult
    func ctl(_ arguments: [String]) throws -> String {
        try Self.withSignalsUnblocked {
            try EmbeddedPostgres.run("/usr/bin/env", environment + [executable] + arguments, asRoot: asRoot)
        }
    }

    /// Runs `body` with no signal blocked on the calling thread, as a program it starts then
    /// begins: a program inherits the mask of the thread that starts it, and the test's threads
    /// (Swift concurrency's and Dispatch's workers, and threads they create) block SIGHUP,
    /// SIGINT, SIGTERM and most others. PostgreSQL sets its own mask; pg_autoctl does not, and its
    /// services then never see the SIGINT or SIGTERM that stops them (`create monitor` waited
    /// for its postgres service forever).
    static func withSignalsUnblocked<T>(_ body: () throws -> T) rethrows -> T {
        var none = sigset_t()
        var previous = sigset_t()
        sigemptyset(&none)
        pthread_sigmask(SIG_SETMASK, &none, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        return try body()
    }

    var environment: [String] {
        ["XDG_CONFIG_HOME=\(folder)/config", "XDG_DATA_HOME=\(folder)/data", "XDG_RUNTIME_DIR=\(folder)/run"]
    }

    /// Starts `pg_autoctl run` for `instance` in the background (its output in
    /// `<folder>/<name>.log`) and keeps its process id: a shell started through
    /// ``EmbeddedPostgres/run(_:_:asRoot:)`` puts it in the background and prints `$!`, which is
    /// the keeper itself (the shell forks and the child execs `env`, which execs `pg_autoctl`).
    func run(_ instance: Instance) throws {
        let script = #"log=$1; shift; "$@" > "$log" 2>&1 < /dev/null & echo $!"#
        let output = try Self.withSignalsUnblocked {
            try EmbeddedPostgres.run(
                "/bin/sh",
                ["-c", script, "sh", "\(folder)/\(instance.name).log", "/usr/bin/env"] + environment
                    + [executable, "run", "--pgdata", instance.pgdata],
                asRoot: asRoot)
        }
        guard let pid = pid_t(output.trimmingWhitespace()) else {
            throw EmbeddedPostgres.EmbeddedError.commandFailed("pg_autoctl run", "no process id: \(output)")
        }
        keepers.withLock { $0[instance.pgdata] = pid }
    }

    /// The formation's nodes as the monitor reports them.
    func state() throws -> [NodeState] {
        let output = try ctl(["show", "state", "--pgdata", monitor.pgdata, "--json"])
        // The output holds pg_autoctl's log lines too (stderr is captured with stdout).
        guard let start = output.firstIndex(of: "["), let end = output.lastIndex(of: "]") else {
            throw EmbeddedPostgres.EmbeddedError.commandFailed("pg_autoctl show state", output)
        }
        return try JSONDecoder().decode([NodeState].self, from: Data(output[start...end].utf8))
    }

    /// The node the monitor has as primary, when both nodes are settled as primary and secondary.
    func settledPrimary() -> Instance? {
        guard let nodes = try? state(), nodes.count == 2,
            nodes.allSatisfy({ $0.current_group_state == $0.assigned_group_state }),
            Set(nodes.map(\.current_group_state)) == ["primary", "secondary"],
            let primary = nodes.first(where: { $0.current_group_state == "primary" })
        else { return nil }
        return self.nodes.first { $0.name == primary.nodename }
    }

    /// Waits (up to 120 s) until one node is primary and the other secondary, each in the state
    /// the monitor assigned, and returns the primary.
    @discardableResult
    func waitForPrimaryAndSecondary() throws -> Instance {
        var primary: Instance?
        try waitUntil("a primary and a secondary") {
            primary = settledPrimary()
            return primary != nil
        }
        return primary!
    }

    /// `pg_autoctl perform failover --wait 60`, then waits until the formation has settled
    /// again (the old primary rewound and streaming as the secondary); returns the new primary.
    @discardableResult
    func performFailover() throws -> Instance {
        try ctl(["perform", "failover", "--pgdata", monitor.pgdata, "--wait", "60"])
        return try waitForPrimaryAndSecondary()
    }

    /// The `capgate` database's URL as an operator gets it, `pg_autoctl show uri` (both nodes,
    /// `target_session_attrs=read-write`), with the user added: the URI carries none, and the
    /// nodes trust loopback connections of their superuser (`postgres`, or the user running the
    /// tests when not root).
    func url() throws -> DatabaseURL {
        let output = try ctl(["show", "uri", "--pgdata", monitor.pgdata, "--formation", "default"])
        guard let uri = output.split(separator: "\n").map({ String($0).trimmingWhitespace() }).first(where: { $0.hasPrefix("postgres://") })
        else { throw EmbeddedPostgres.EmbeddedError.commandFailed("pg_autoctl show uri", output) }
        let user = asRoot ? "postgres" : (getpwuid(getuid())?.pointee.pw_name).map { String(cString: $0) } ?? "postgres"
        return try DatabaseURL("postgres://\(user)@" + uri.dropFirst("postgres://".count))
    }

    /// Stops the keepers this formation started (nodes first, the monitor last), each by its
    /// process id: SIGTERM, after which the keeper stops its PostgreSQL (fast shutdown) and
    /// exits. A keeper still running after 60 s is killed, and its PostgreSQL stopped
    /// immediately through `pg_ctl` on its folder. The folder stays (the caller removes it).
    func stop() {
        for instance in nodes.reversed() + [monitor] {
            guard let pid = keepers.withLock({ $0.removeValue(forKey: instance.pgdata) }) else { continue }
            guard isKeeper(pid, of: instance) else { continue }
            kill(pid, SIGTERM)
            let deadline = Date().addingTimeInterval(60)
            while isKeeper(pid, of: instance) && Date() < deadline { usleep(100_000) }
            if isKeeper(pid, of: instance) {
                kill(pid, SIGKILL)
                _ = try? EmbeddedPostgres.run(
                    binDirectory + "/pg_ctl", ["-D", instance.pgdata, "-m", "immediate", "-w", "stop"], asRoot: asRoot)
            }
        }
    }

    /// True while `pid` is still the keeper started for `instance` (its command line names that
    /// folder): a process id that ended may be given to another process, never to be signalled.
    func isKeeper(_ pid: pid_t, of instance: Instance) -> Bool {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
        let arguments = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        return arguments.contains { $0.hasSuffix("pg_autoctl") } && arguments.contains(instance.pgdata)
    }

    /// Polls `condition` every 250 ms for up to `seconds`; throws naming `what` on a timeout.
    func waitUntil(_ what: String, seconds: Double = 120, _ condition: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            guard Date() < deadline else {
                let seen = (try? ctl(["show", "state", "--pgdata", monitor.pgdata])) ?? "(no state)"
                throw EmbeddedPostgres.EmbeddedError.commandFailed("pg_auto_failover", "no \(what) within \(Int(seconds)) s:\n\(seen)")
            }
            usleep(250_000)
        }
    }
}
