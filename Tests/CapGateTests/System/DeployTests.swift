import AsyncHTTPClient
import CapGateDev
import Foundation
import NIOCore
import Testing

@testable import CapGate

/// `deploy/`: the install script, the systemd unit, its environment file, and the binary run the
/// way the unit runs it (issue #49 item 2). systemd itself is not running on a test machine, so
/// the unit is checked by `systemd-analyze verify` and its way of starting the binary is done by
/// hand: its user (an unprivileged one, `nobody` here), its environment file, its state folder as
/// the working folder and spool, no privileges to gain (`setpriv`, which execs in place as
/// systemd does, so the signal goes to the gateway itself).
@Suite("Deploy: install, the systemd unit, the binary as the unit runs it", .timeLimit(.minutes(5)))
struct DeployTests {
    static let user = "nobody"
    static let group = "nogroup"

    /// Runs `deploy/install.sh --root` with the debug binary into a new folder: the installed tree.
    static func install() async throws -> URL {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("capgate-install-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        let (status, output) = try await SDKTests.run(
            "bash", [SDKTests.root.appendingPathComponent("deploy/install.sh").path, "--binary", CommandTests.binary, "--root", root.path],
            environment: [:])
        #expect(status == 0, "\(output)")
        #expect(output.contains("installed under \(root.path)"), "\(output)")
        #expect(!output.contains("systemd-analyze verify:"), "\(output)")
        return root
    }

    @Test(
        "install.sh --root: the binary, the unit, the environment file (0640), the defaults and the docs in their FHS places; systemd-analyze verify has nothing to say about the unit"
    )
    func installTree() async throws {
        let root = try await Self.install()
        defer { try? FileManager.default.removeItem(at: root) }
        let fm = FileManager.default
        #expect(fm.isExecutableFile(atPath: root.path + "/usr/local/bin/capgate"))
        for file in [
            "etc/systemd/system/capgate.service", "etc/capgate/capgate.env", "etc/capgate/capgate.json",
            "usr/local/share/doc/capgate/README.md",
        ] {
            #expect(fm.fileExists(atPath: root.path + "/" + file), "\(file)")
        }
        let mode = try fm.attributesOfItem(atPath: root.path + "/etc/capgate/capgate.env")[.posixPermissions] as? Int
        #expect(mode == 0o640)
        let unit = try String(contentsOf: root.appendingPathComponent("etc/systemd/system/capgate.service"), encoding: .utf8)
        for directive in [
            "User=capgate", "NoNewPrivileges=yes", "ProtectSystem=strict", "StateDirectory=capgate", "Restart=on-failure",
            "LimitNOFILE=", "KillSignal=SIGTERM", "TimeoutStopSec=", "ExecStartPre=/usr/local/bin/capgate check-config",
            "ExecStart=/usr/local/bin/capgate serve", "EnvironmentFile=/etc/capgate/capgate.env",
        ] {
            #expect(unit.contains(directive), "\(directive)")
        }
        // Run again over an operator's edited configuration: it is kept.
        let env = root.appendingPathComponent("etc/capgate/capgate.env")
        try Data("DATABASE_URL=postgres://edited@127.0.0.1/x\n".utf8).write(to: env)
        _ = try await SDKTests.run(
            "bash", [SDKTests.root.appendingPathComponent("deploy/install.sh").path, "--binary", CommandTests.binary, "--root", root.path],
            environment: [:])
        #expect(try String(contentsOf: env, encoding: .utf8) == "DATABASE_URL=postgres://edited@127.0.0.1/x\n")
    }

    @Test(
        "the installed binary as the unit runs it (nobody, the environment file, the state folder): check-config 0 on a fresh database and 2 naming what is wrong; serve migrates and serves; SIGTERM drains a stream in flight, settles it, exit 0"
    )
    func runAsTheUnitRunsIt() async throws {
        let root = try await Self.install()
        defer { try? FileManager.default.removeItem(at: root) }
        let binary = root.path + "/usr/local/bin/capgate"
        // What systemd does for the unit: the state folder, owned by the service's user, 0700.
        let state = root.path + "/var/lib/capgate"
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        _ = try await SDKTests.run("chown", ["\(Self.user):\(Self.group)", state], environment: [:])
        _ = try await SDKTests.run("chmod", ["0700", state], environment: [:])
        // What install.sh does with a real user: the configuration readable by its group.
        _ = try await SDKTests.run(
            "chgrp", [Self.group, root.path + "/etc/capgate", root.path + "/etc/capgate/capgate.json"], environment: [:])

        let mockPort = try EmbeddedPostgres.freePort()
        let mock = try ChildProcess(binary, ["mock", "--port", String(mockPort)], output: .null, errors: .null)
        defer { mock.terminate() }

        let name = "deploy_" + UUID().uuidString.prefix(8).lowercased()
        let url = try await offPool { try TestCluster.shared.get().createDatabase(name) }
        let port = try EmbeddedPostgres.freePort()
        // The operator's edit of the installed file: the two required values, a token, a port.
        var environment = try Self.environmentFile(root.appendingPathComponent("etc/capgate/capgate.env"))
        environment.merge([
            "DATABASE_URL": url.text, "UPSTREAM_URL": "http://127.0.0.1:\(mockPort)", "HTTP_PORT": String(port),
            "OPERATOR_TOKEN": "op_deploy-operator-token-for-the-tests", "LOG_LEVEL": "warning",
        ]) { _, new in new }
        // The unit's own Environment= lines.
        environment["CAPGATE_CONFIG"] = root.path + "/etc/capgate/capgate.json"
        environment["SPOOL_DIRECTORY"] = state + "/spool"

        let (checked, checkOut) = try await Self.asUnit(binary, ["check-config"], environment: environment, folder: state)
        #expect(checked == 0, "\(checkOut)")
        #expect(checkOut.contains("configuration ok"), "\(checkOut)")
        #expect(
            checkOut.contains("pending (serve applies them at start): 0030_baseline"),
            "a fresh database has its migrations pending: \(checkOut)")
        var bad = environment
        bad["DATABASE_TIMEOUT"] = "soon"
        let (refused, refusedOut) = try await Self.asUnit(binary, ["check-config"], environment: bad, folder: state)
        #expect(refused == 2, "\(refusedOut)")
        #expect(refusedOut.contains("database.timeout"), "\(refusedOut)")

        let serve = try ChildProcess(
            "/usr/bin/setpriv", Self.setpriv + [binary, "serve"], environment: environment, directory: state, output: .null, errors: .null)
        defer { serve.terminate() }
        let base = "http://127.0.0.1:\(port)"
        try #require(try await Harness.ready(base), "the installed capgate serve did not become ready")
        let (after, afterOut) = try await Self.asUnit(binary, ["check-config"], environment: environment, folder: state)
        #expect(after == 0 && afterOut.contains("no migrations pending"), "serve migrated the database: \(afterOut)")

        let unitEnvironment = environment
        try await Harness.with(database: url, upstreamURL: "http://127.0.0.1:\(mockPort)") { h in
            try await h.createPlan("deploy", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "deploy", users: 1)
            try await CommandTests.drainsOnSIGTERM(serve, base: base, key: users[0].key, company: company, h)
            #expect(try await CapGateRunner.verify(url: url, logger: TestCluster.logger).isEmpty)
            // A database migrated by a newer binary: this one refuses it before serving.
            try await h.exec("INSERT INTO capgate_migrations (version, checksum) VALUES ('9999_future', 'x')")
            let (newer, newerOut) = try await Self.asUnit(binary, ["check-config"], environment: unitEnvironment, folder: state)
            #expect(newer == 2, "\(newerOut)")
            #expect(newerOut.contains("database.url") && newerOut.contains("9999_future"), "\(newerOut)")
            #expect(!newerOut.contains(url.text), "the URL (its password) is never printed")
        }
        // Nothing was written outside the state folder's spool.
        #expect(FileManager.default.fileExists(atPath: state + "/spool"))
    }

    /// `setpriv`'s arguments for the unit's `User=`, `Group=` and `NoNewPrivileges=yes`.
    static let setpriv = ["--reuid=\(user)", "--regid=\(group)", "--clear-groups", "--no-new-privs", "--"]

    /// Runs `binary arguments` as the unit's user with exactly `environment`, in `folder`.
    static func asUnit(
        _ binary: String, _ arguments: [String], environment: [String: String], folder: String
    ) async throws -> (
        Int32, String
    ) {
        try await SDKTests.run(
            URL(fileURLWithPath: "/usr/bin/setpriv"), setpriv + [binary] + arguments, environment: environment,
            folder: URL(fileURLWithPath: folder))
    }

    /// The variables an `EnvironmentFile=` sets: `NAME=value` lines, `#` comments skipped.
    static func environmentFile(_ file: URL) throws -> [String: String] {
        var values: [String: String] = ["PATH": "/usr/local/bin:/usr/bin:/bin"]
        for line in try String(contentsOf: file, encoding: .utf8).split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: "=", maxSplits: 1).map(String.init)
            if parts.count == 2 { values[parts[0]] = parts[1] }
        }
        return values
    }
}
