import CapGateDev
import Foundation
import Synchronization
import Testing

@testable import CapGate

#if canImport(Glibc)
    import Glibc
#endif

/// The `capgate` binary serving HTTPS: a renewed certificate taken on SIGHUP while calls run on
/// kept connections, and the start refused for bad files. The signal goes only to the child's
/// process id.
@Suite("HTTPS on the listener: SIGHUP reload and refused starts (the capgate binary)", .timeLimit(.minutes(5)))
struct ListenerTLSReloadTests {
    /// Calls made by each kept connection so far, and the word to stop.
    final class Progress: Sendable {
        let counts: Mutex<[Int]>
        let stopped = Atomic(false)

        init(connections: Int) { counts = Mutex(Array(repeating: 0, count: connections)) }

        var now: [Int] { counts.withLock { $0 } }

        /// Waits up to 30 s until every connection has made `more` calls past `mark`.
        func wait(forMore more: Int, than mark: [Int]) async throws {
            for _ in 0..<1500 {
                if zip(now, mark).allSatisfy({ $0 >= $1 + more }) { return }
                try await Task.sleep(for: .milliseconds(20))
            }
            Issue.record("the kept connections stalled at \(now) (mark \(mark))")
            throw CancellationError()
        }
    }

    /// What one kept connection saw.
    struct Kept: Sendable {
        var served: HTTPSSession.Served?
        var statuses: [Int]
        var open: Bool
    }

    /// Runs `capgate serve` with `environment` (plus PATH), its output in `log`.
    static func serve(_ environment: [String: String], log: String) throws -> ChildProcess {
        try ChildProcess(
            CommandTests.binary, ["serve", "--config", "/nonexistent.json"],
            environment: environment.merging(["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]) { _, new in new },
            output: .file(log), errors: .sameAsOutput)
    }

    /// The certificate a new connection is served, once it is `expected` (polled for 10 s).
    static func newConnection(port: Int, serves expected: HTTPSSession.Served) async throws -> HTTPSSession.Served? {
        var served: HTTPSSession.Served?
        for _ in 0..<100 {
            served = try await HTTPSSession.with(port: port) { session in
                #expect(try await session.send(.GET, "/healthz").status == 200)
                return try await session.served()
            }
            if served == expected { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return served
    }

    /// Waits up to 10 s for `text` in the file at `path`.
    static func logged(_ text: String, in path: String) async throws -> Bool {
        for _ in 0..<100 {
            if (try? String(contentsOfFile: path, encoding: .utf8))?.contains(text) == true { return true }
            try await Task.sleep(for: .milliseconds(100))
        }
        return false
    }

    /// The base64 lines of a PEM key: what must never appear in a log.
    static func secretLines(_ pem: String) -> [String] {
        pem.split(separator: "\n").map(String.init).filter { !$0.hasPrefix("-----") && $0.count > 16 }
    }

    @Test(
        "SIGHUP after a renewal: calls on kept connections go on with the old certificate, new connections get the renewed one; a bad file on the next SIGHUP keeps it, logged without the key"
    )
    func reloadOnSIGHUP() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let first = try ListenerTLSTests.issue(days: 30)
        let renewed = try ListenerTLSTests.issue(days: 90)
        let files = try ListenerTLSTests.PEMFiles(first)
        defer { files.remove() }
        try await Harness.with { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "open", users: 1)
            let port = try EmbeddedPostgres.freePort()
            let log = files.folder + "/capgate.log"
            let serve = try Self.serve(
                [
                    "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port),
                    "OPERATOR_TOKEN": "op_tls-reload-operator-token-for-tests", "HTTP_TLS_CERTIFICATE": files.certificate,
                    "HTTP_TLS_KEY": files.key, "SPOOL_DIRECTORY": files.folder + "/spool",
                ], log: log)
            defer { serve.terminate() }
            try #require(try await Harness.ready("https://127.0.0.1:\(port)"), "capgate serve did not become ready over HTTPS")

            let kept = try await Self.reloadWhileCalling(
                port: port, key: users[0].key, serve: serve, files: files, renewed: renewed, log: log)
            for connection in kept {
                #expect(connection.served == (try ListenerTLSTests.served(first)), "a kept connection keeps the certificate it began with")
                #expect(connection.open)
                #expect(connection.statuses.count >= 7 && connection.statuses.allSatisfy { $0 == 200 }, "\(connection.statuses)")
            }

            serve.terminate()
            #expect(await serve.wait(timeout: .seconds(30)) == 0)
            let text = try String(contentsOfFile: log, encoding: .utf8)
            let renewedSerial = try ListenerTLSTests.served(renewed).serial
            #expect(text.contains("serving HTTPS"), "\(text)")
            #expect(text.components(separatedBy: "TLS certificate reloaded").count - 1 == 1, "\(text)")
            #expect(text.contains("serial=\(renewedSerial)"), "\(text)")
            for secret in Self.secretLines(first.key.pemRepresentation) + Self.secretLines(renewed.key.pemRepresentation)
                + Self.secretLines(TestPKI.shared.wrongName.key.pemRepresentation)
            {
                #expect(!text.contains(secret), "a key's content was logged")
            }
            // Every answered call charged once: the kept connections' calls (the probes were /healthz).
            let answered = kept.reduce(0) { $0 + $1.statuses.count }
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'")
                    == Int64(answered))
        }
    }

    /// Four kept connections call on while the files are renewed and SIGHUP sent, then while a bad
    /// key is put in place and SIGHUP sent again; returns what each connection saw.
    static func reloadWhileCalling(
        port: Int, key: String, serve: ChildProcess, files: ListenerTLSTests.PEMFiles, renewed: TestPKI.Issued, log: String
    ) async throws -> [Kept] {
        let progress = Progress(connections: 4)
        return try await withThrowingTaskGroup(of: Kept.self) { group in
            for index in 0..<4 {
                group.addTask {
                    try await HTTPSSession.with(port: port) { session in
                        var kept = Kept(served: nil, statuses: [], open: false)
                        while !progress.stopped.load(ordering: .relaxed) {
                            kept.statuses.append(try await session.message(key: key).status)
                            if kept.served == nil { kept.served = try await session.served() }
                            progress.counts.withLock { $0[index] += 1 }
                            try await Task.sleep(for: .milliseconds(20))
                        }
                        kept.open = session.isOpen
                        return kept
                    }
                }
            }
            defer { progress.stopped.store(true, ordering: .relaxed) }
            try await progress.wait(forMore: 2, than: [0, 0, 0, 0])
            try files.write(renewed)
            #expect(serve.terminate(signal: SIGHUP))
            let expected = try ListenerTLSTests.served(renewed)
            #expect(try await newConnection(port: port, serves: expected) == expected, "a new connection gets the renewed certificate")
            try await progress.wait(forMore: 3, than: progress.now)

            // A key that is not the certificate's: the reload is refused, the renewed one stays.
            try TestPKI.shared.wrongName.key.pemRepresentation.write(toFile: files.key, atomically: true, encoding: .utf8)
            #expect(serve.terminate(signal: SIGHUP))
            #expect(try await logged("TLS certificate not reloaded", in: log))
            #expect(try await newConnection(port: port, serves: expected) == expected, "a bad file on reload keeps the served certificate")
            try await progress.wait(forMore: 2, than: progress.now)
            progress.stopped.store(true, ordering: .relaxed)
            var all: [Kept] = []
            for try await connection in group { all.append(connection) }
            return all
        }
    }

    @Test("without http.tls.* a SIGHUP (systemctl reload) is logged and the gateway goes on serving: it does not end the process")
    func sighupWithoutTLS() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let folder = NSTemporaryDirectory() + "capgate-sighup-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try await Harness.with { h in
            let port = try EmbeddedPostgres.freePort()
            let log = folder + "/capgate.log"
            let serve = try Self.serve(
                [
                    "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port),
                    "SPOOL_DIRECTORY": folder + "/spool",
                ], log: log)
            defer { serve.terminate() }
            let base = "http://127.0.0.1:\(port)"
            try #require(try await Harness.ready(base), "capgate serve did not become ready")
            #expect(serve.terminate(signal: SIGHUP))
            #expect(try await Self.logged("SIGHUP: nothing to reload", in: log))
            #expect(serve.isRunning)
            #expect(try await h.request(.GET, "/healthz", base: base).status == 200)
            serve.terminate()
            #expect(await serve.wait(timeout: .seconds(30)) == 0)
        }
    }

    @Test(
        "serve refuses to start, exit 2 with one line naming the key, for a missing file, one key without the other, a key that is not the certificate's, a file that is not PEM"
    )
    func refusedStarts() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let good = try ListenerTLSTests.PEMFiles(TestPKI.shared.localhost)
        let other = try ListenerTLSTests.PEMFiles(TestPKI.shared.wrongName)
        defer {
            good.remove()
            other.remove()
        }
        let missing = good.folder + "/missing.crt"
        let notPEM = good.folder + "/notes.txt"
        try "not a certificate\n".write(toFile: notPEM, atomically: true, encoding: .utf8)
        // Everything else the start needs is there: the files are what stop it.
        let base = [
            "DATABASE_URL": "postgres://capgate@127.0.0.1:9/none", "UPSTREAM_URL": "http://127.0.0.1:9", "HTTP_PORT": "0",
            "OPERATOR_TOKEN": "", "OPERATOR_TOKENS": "", "JWT_SECRET": "",
        ]
        let prefix = "configuration error: "
        let cases: [([String: String], String)] = [
            (
                ["HTTP_TLS_CERTIFICATE": missing, "HTTP_TLS_KEY": good.key],
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) names a file that does not exist: \(missing)"
            ),
            (
                ["HTTP_TLS_CERTIFICATE": good.certificate],
                "http.tls.key (HTTP_TLS_KEY) is required when http.tls.certificate is set (HTTPS needs both files)"
            ),
            (
                ["HTTP_TLS_KEY": good.key],
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) is required when http.tls.key is set (HTTPS needs both files)"
            ),
            (
                ["HTTP_TLS_CERTIFICATE": good.certificate, "HTTP_TLS_KEY": other.key],
                "http.tls.key (HTTP_TLS_KEY) names a private key that is not the certificate's (http.tls.certificate): \(other.key) does not match \(good.certificate)"
            ),
            (
                ["HTTP_TLS_CERTIFICATE": notPEM, "HTTP_TLS_KEY": good.key],
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) names a file with no readable PEM certificate: \(notPEM)"
            ),
        ]
        for (environment, expected) in cases {
            let (status, output) = try await SDKTests.run(
                CommandTests.binary, ["serve", "--config", "/nonexistent.json"], environment: base.merging(environment) { _, new in new })
            #expect(status == 2, "\(output)")
            #expect(output.trimmingCharacters(in: .whitespacesAndNewlines) == prefix + expected)
            for secret in Self.secretLines(TestPKI.shared.localhost.key.pemRepresentation)
                + Self.secretLines(TestPKI.shared.wrongName.key.pemRepresentation)
            {
                #expect(!output.contains(secret))
            }
        }
    }
}
