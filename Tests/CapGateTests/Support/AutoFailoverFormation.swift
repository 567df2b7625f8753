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

    /// Monitor settings (`pgautofailover.*` GUCs of the monitor's PostgreSQL, all reloadable)
    /// for a test that kills the primary and lets the monitor fail over by itself, in a few
    /// seconds rather than about a minute. With pg_auto_failover's defaults (checked on this
    /// machine: 52 s from the kill to `wait_primary`), the monitor connects to each node every
    /// `health_check_period` (5 s) with a `health_check_timeout` (5 s) and retries a failed
    /// check `health_check_max_retries` (2) times `health_check_retry_delay` (2 s) apart; a node
    /// whose check failed is unhealthy only once its keeper has not reported for
    /// `node_considered_unhealthy_timeout` (20 s), so a short network blip or a busy node fails
    /// nothing over. The monitor then waits `primary_demote_timeout` (30 s) for the old primary
    /// to report it has stopped before it promotes the secondary: a primary that is only cut off
    /// from the monitor and the secondary stops itself after its keeper's
    /// `timeout.network_partition_timeout` (20 s), so in production `primary_demote_timeout`
    /// must stay above that, or both nodes may accept writes. Here the old primary is dead (the
    /// test killed it), so nothing can write there; keep the defaults in production.
    static let quickFailureDetection: KeyValuePairs<String, String> = [
        "pgautofailover.health_check_period": "1000",  // ms
        "pgautofailover.health_check_timeout": "2000",  // ms, the health check's connect timeout
        "pgautofailover.health_check_max_retries": "1",
        "pgautofailover.health_check_retry_delay": "500",  // ms
        "pgautofailover.node_considered_unhealthy_timeout": "3000",  // ms since the keeper's last report
        "pgautofailover.primary_demote_timeout": "3000",  // ms
    ]

    /// Creates and runs a monitor and two nodes in a new folder `directory` (its `capgate`
    /// database made by pg_autoctl on the first node), and waits until the monitor reports a
    /// primary and a secondary. `monitorSettings` (e.g. ``quickFailureDetection``) go into the
    /// monitor's `postgresql.auto.conf` before it starts, and are read back from `pg_settings`
    /// (a misspelt `pgautofailover.*` name would only be warned about). On a failure what was
    /// started is stopped again.
    static func start(directory: String, monitorSettings: KeyValuePairs<String, String> = [:]) throws -> AutoFailoverFormation {
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
            try formation.tune(monitor, monitorSettings.map { "\($0.key) = \($0.value)" })
            try formation.run(monitor)
            try formation.waitUntil("the monitor accepts connections") {
                (try? EmbeddedPostgres.capture(bin + "/pg_isready", ["-q", "-h", "127.0.0.1", "-p", "\(monitor.port)"])) != nil
            }
            if monitorSettings.count > 0 { try formation.checkMonitorSettings(monitorSettings) }
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
    /// `more` lines follow those (the monitor's `pgautofailover.*` settings).
    func tune(_ instance: Instance, _ more: [String] = []) throws {
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: instance.pgdata + "/postgresql.auto.conf"))
        defer { try? handle.close() }
        try handle.seekToEnd()
        let lines = ["shared_buffers = '64MB'", "fsync = off"] + more
        try handle.write(contentsOf: Data(lines.map { $0 + "\n" }.joined().utf8))
    }

    /// Throws unless the running monitor has each of `settings` (its `pg_settings.setting`,
    /// the raw value in the setting's unit).
    func checkMonitorSettings(_ settings: KeyValuePairs<String, String>) throws {
        let output = try EmbeddedPostgres.run(
            binDirectory + "/psql",
            [
                "-h", "127.0.0.1", "-p", "\(monitor.port)", "-d", "pg_auto_failover", "-tAq", "-c",
                "SELECT name || '=' || setting FROM pg_settings WHERE name LIKE 'pgautofailover.%'",
            ],
            asRoot: asRoot)
        let found = Set(output.split(separator: "\n").map { String($0).trimmingWhitespace() })
        let missing = settings.map { "\($0.key)=\($0.value)" }.filter { !found.contains($0) }
        guard missing.isEmpty else {
            throw EmbeddedPostgres.EmbeddedError.commandFailed(
                "monitor settings", "not in effect: \(missing); the monitor has \(found.sorted())")
        }
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

    /// What ``killHard(_:)`` killed, and when.
    struct Crash: Sendable {
        /// When the last process was sent SIGKILL.
        var at: ContinuousClock.Instant
        /// `pg_autoctl run` and the services it runs (and any program one of them was running).
        var keeperProcesses: [pid_t]
        /// The postmaster and its children.
        var postgresProcesses: [pid_t]
    }

    /// Kills `instance` as a crash of its machine would, each process by its id and only that
    /// node's: its keeper first (`pg_autoctl run` and the services it forks, its `start/stop
    /// postgres` and `node active`: left alive, the first restarts PostgreSQL within ~0.5 s and
    /// the second goes on reporting to the monitor), then its postmaster (the first line of
    /// `postmaster.pid`) and the postmaster's children. Every process is stopped (SIGSTOP, which
    /// also keeps it from completing a fork) before its children are read from `/proc`, so none
    /// starts another unseen; then all get SIGKILL, the keeper's first. Waits until they are
    /// gone. The node stays down: its keeper is no longer one of this formation's, so ``stop()``
    /// passes it by. The postmaster's small System V segment, which only a restart in the same
    /// folder would remove, is removed; the folder is the caller's to remove.
    func killHard(_ instance: Instance) throws -> Crash {
        guard let keeper = keepers.withLock({ $0.removeValue(forKey: instance.pgdata) }), isKeeper(keeper, of: instance) else {
            throw EmbeddedPostgres.EmbeddedError.commandFailed("kill \(instance.name)", "its keeper is not running")
        }
        let pidFile = (try String(contentsOfFile: instance.pgdata + "/postmaster.pid", encoding: .utf8))
            .split(separator: "\n", omittingEmptySubsequences: false).map { String($0).trimmingWhitespace() }
        guard let postmaster = pidFile.first.flatMap({ pid_t($0) }), Self.commandLine(of: postmaster).contains(instance.pgdata) else {
            throw EmbeddedPostgres.EmbeddedError.commandFailed("kill \(instance.name)", "no postmaster of \(instance.pgdata)")
        }
        // Line 7: the System V key and id of the segment the postmaster keeps.
        let segment = pidFile.count > 6 ? pidFile[6].split(separator: " ").compactMap { Int($0) } : []

        let keeperProcesses = Self.stopTree(keeper, leavingOut: postmaster)
        let postgresProcesses = Self.stopTree(postmaster)
        for pid in keeperProcesses + postgresProcesses { kill(pid, SIGKILL) }
        let at = ContinuousClock.now
        let all = keeperProcesses + postgresProcesses
        try waitUntil("end of \(instance.name)'s processes \(all)", seconds: 30) { all.allSatisfy { !Self.isAlive($0) } }
        if segment.count == 2 {
            var info = shmid_ds()
            if shmctl(Int32(segment[1]), IPC_STAT, &info) == 0, Int(info.shm_perm.__key) == segment[0], info.shm_nattch == 0 {
                shmctl(Int32(segment[1]), IPC_RMID, nil)
            }
        }
        return Crash(at: at, keeperProcesses: keeperProcesses, postgresProcesses: postgresProcesses)
    }

    /// `root` and its descendants (without the subtree of `leftOut`), each stopped with SIGSTOP
    /// before its children are read.
    static func stopTree(_ root: pid_t, leavingOut leftOut: pid_t? = nil) -> [pid_t] {
        var found: [pid_t] = []
        var queue = [root]
        while let pid = queue.popLast() {
            guard pid != leftOut, kill(pid, SIGSTOP) == 0 else { continue }
            found.append(pid)
            let children = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
            queue += children.split(whereSeparator: \.isWhitespace).compactMap { pid_t($0) }
        }
        return found
    }

    /// A process's arguments (`/proc/<pid>/cmdline`), empty when it has ended.
    static func commandLine(of pid: pid_t) -> [String] {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return [] }
        return data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
    }

    /// False once `pid` has ended (gone, or a zombie not yet reaped).
    static func isAlive(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else {
            return false
        }
        return String(stat[stat.index(after: close)...]).trimmingWhitespace().first != "Z"
    }

    /// Waits (up to `seconds`) until the monitor reports a node other than `old` as having
    /// reached `wait_primary` or `primary` (its `current_group_state`), and returns that node.
    func waitForPromotion(replacing old: Instance, seconds: Double = 120) throws -> Instance {
        var promoted: Instance?
        try waitUntil("promotion of a node other than \(old.name)", seconds: seconds) {
            let reported = (try? state()) ?? []
            let node = reported.first { $0.nodename != old.name && ["wait_primary", "primary"].contains($0.current_group_state) }
            promoted = node.flatMap { node in nodes.first { $0.name == node.nodename } }
            return promoted != nil
        }
        return promoted!
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
        let arguments = Self.commandLine(of: pid)
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
