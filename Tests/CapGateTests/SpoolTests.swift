import AsyncHTTPClient
import Foundation
import Logging
import Testing

@testable import CapGate
@testable import CapGateDev

#if canImport(Glibc)
    import Glibc
#endif

/// Writes the database could not take (a refund, a give-back, token counts, a kept answer) wait
/// in the local spool, fsynced, and reach the database after a crash of the gateway.
@Suite("Spool", .serialized, .timeLimit(.minutes(10)))
struct SpoolTests {
    static func folder() -> String { NSTemporaryDirectory() + "capgate-spool-test-" + UUID().uuidString }

    @Test("entries are kept in order, only this database's are replayed, an unreadable one is moved aside")
    func entries() throws {
        let directory = Self.folder()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let spool = try Spool(directory: directory, database: "capgate@a", logger: TestCluster.logger)
        let other = try Spool(directory: directory, database: "capgate@b", logger: TestCluster.logger)
        let company = UUID()
        try spool.put(.refund(company: company, ledger: 1, requestID: "r1", status: 500))
        try other.put(.refund(company: company, ledger: 2, requestID: "r2", status: nil))
        try spool.put(
            .settle(
                company: company, ledger: 3, status: 200, inputTokens: 5, outputTokens: nil, cacheWrite5m: nil, cacheWrite1h: nil,
                cacheRead: nil, known: false))
        FileManager.default.createFile(atPath: directory + "/0000-broken.json", contents: Data("{".utf8))
        let pending = spool.pending()
        #expect(
            pending.map(\.write) == [
                .refund(company: company, ledger: 1, requestID: "r1", status: 500),
                .settle(
                    company: company, ledger: 3, status: 200, inputTokens: 5, outputTokens: nil, cacheWrite5m: nil, cacheWrite1h: nil,
                    cacheRead: nil, known: false),
            ])
        #expect(FileManager.default.fileExists(atPath: directory + "/0000-broken.json.bad"))
        for entry in pending { spool.remove(entry.name) }
        #expect(spool.pending().isEmpty)
        #expect(other.pending().count == 1)
        // A new spool on the folder counts what is there.
        #expect(try Spool(directory: directory, database: "capgate@b", logger: TestCluster.logger).depth == 1)
    }

    /// Starts `capgate serve` with `environment` (plus this process's `PATH`), its output and
    /// errors in `log` (emptied first) or discarded.
    static func startServe(_ environment: [String: String], log: String? = nil) throws -> ChildProcess {
        try ChildProcess(
            CommandTests.binary, ["serve"],
            environment: environment.merging(["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]) { a, _ in a },
            output: log.map { .file($0) } ?? .null, errors: .sameAsOutput)
    }

    /// Polls `GET /healthz` on a connection of its own each time (a pooled client connection to
    /// a gateway that was killed must not be what is measured).
    static func waitReady(_ base: String) async throws -> Bool {
        let port = Int(base.split(separator: ":").last ?? "") ?? 0
        for _ in 0..<160 {
            if let connection = try? await RawConnection.open(port: port) {
                defer { connection.close() }
                try? await connection.send("GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
                if await connection.answer(within: .seconds(2))?.status == 200 { return true }
            }
            try await Task.sleep(for: .milliseconds(250))
        }
        return false
    }

    @Test("a refund that meets a stopped database survives kill -9 of the gateway: the next start replays it from the spool")
    func refundSurvivesCrash() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        try await FailClosedTests.withOwnCluster { cluster in
            let made = try await FailClosedTests.company(on: cluster.url, users: 1)
            try await Harness.with(database: cluster.url) { h in
                let spoolFolder = Self.folder()
                defer { try? FileManager.default.removeItem(atPath: spoolFolder) }
                let port = try EmbeddedPostgres.freePort()
                let base = "http://127.0.0.1:\(port)"
                let environment = [
                    "DATABASE_URL": cluster.url.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port), "DATABASE_TIMEOUT": "2",
                    "SPOOL_DIRECTORY": spoolFolder, "LOG_LEVEL": "warning", "OPERATOR_TOKEN": "op_spool-operator-token-for-the-tests",
                ]
                let first = try Self.startServe(environment)
                defer { first.terminate(signal: SIGKILL) }
                try #require(try await Self.waitReady(base))
                let key = made.users[0].key
                let used = "SELECT coalesce(sum(used), 0) FROM company_usage WHERE company_id = '\(made.company.text)'"
                #expect(try await h.message(key: key, headers: [], base: base).status == 200)
                // Token counts commit asynchronously (`synchronous_commit = off`, by design: the
                // charge is already durable), so an immediate stop of the cluster within a few
                // hundred ms of their commit could lose them with no error for the gateway to
                // spool. Wait until they are written; the next admission's synchronous commit
                // then makes them durable, and they must survive the crash below.
                let settled =
                    "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND settled_at IS NOT NULL AND output_tokens IS NOT NULL"
                #expect(try await h.eventually(settled, equals: 1) == 1)

                // A call the provider fails after 3 s; the database goes away meanwhile.
                async let failing = h.message(key: key, headers: [("x-mock-delay-ms", "3000"), ("x-mock-status", "500")], base: base)
                #expect(try await h.eventually(used, equals: 2) == 2)
                cluster.kill()
                #expect(try await failing.status == 500)
                // Answered only after the refund was in the spool.
                let spooled = Spool.names(in: spoolFolder).compactMap {
                    FileManager.default.contents(atPath: spoolFolder + "/" + $0).map { String(decoding: $0, as: UTF8.self) }
                }
                #expect(spooled.filter { $0.contains(#""refund""#) && $0.contains(#""status":500"#) }.count == 1, "\(spooled)")
                first.terminate(signal: SIGKILL)
                await first.wait()

                try cluster.restart()
                let second = try Self.startServe(environment)
                defer { second.terminate() }
                try #require(try await Self.waitReady(base))
                #expect(try await h.eventually(used, equals: 1, within: .seconds(30)) == 1)
                #expect(
                    try await h.scalar(
                        "SELECT count(*) FROM usage_ledger WHERE company_id = '\(made.company.text)' AND outcome = 'refunded' AND upstream_status = 500"
                    ) == 1)
                // The first call's token counts survived the crash.
                #expect(try await h.scalar(settled) == 1)
                for _ in 0..<40 where !Spool.names(in: spoolFolder).isEmpty { try await Task.sleep(for: .milliseconds(250)) }
                #expect(Spool.names(in: spoolFolder).isEmpty)
                let metrics = try await h.request(
                    .GET, "/metrics", headers: [("authorization", "Bearer op_spool-operator-token-for-the-tests")], base: base
                ).body
                #expect(metrics.contains("capgate_spool_depth 0"), "\(metrics.split(separator: "\n").filter { $0.contains("spool") })")
                // Calls the provider served (2xx) == calls charged.
                #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == Int64(h.mock.served.count))
                #expect(try await CapGateRunner.verify(url: cluster.url, logger: TestCluster.logger).isEmpty)
            }
        }
    }
}
