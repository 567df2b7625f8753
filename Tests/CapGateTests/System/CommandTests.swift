import AsyncHTTPClient
import CapGate
import CapGateDev
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@Suite("The capgate commands, as the real binary", .timeLimit(.minutes(5)))
struct CommandTests {
    static var binary: String { SDKTests.root.appendingPathComponent(".build/debug/capgate").path }

    @Test("migrate --dry-run, rollover --at/--dry-run and verify print what they did and exit 0, verify exits 1 on a mismatch")
    func migrateRolloverVerify() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        try await Harness.with { h in
            let env = ["DATABASE_URL": h.databaseURL.text]
            let (migrated, migrateOut) = try await SDKTests.run(Self.binary, ["migrate", "--dry-run"], environment: env)
            #expect(migrated == 0)
            #expect(migrateOut.contains("nothing to apply"))

            try await h.createPlan("low", company: 100, user: 25)
            let (company, _) = try await h.createCompany(plan: "low", users: 1, startedAt: "2026-01-15T00:00:00Z")
            let (dry, dryOut) = try await SDKTests.run(
                Self.binary, ["rollover", "--at", "2026-03-20T00:00:00Z", "--dry-run"], environment: env)
            #expect(dry == 0)
            #expect(dryOut.contains("moved 1 companies, 0 to default plan, 0 unchanged (dry run: nothing changed)"))
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 1)
            let (rolled, rollOut) = try await SDKTests.run(Self.binary, ["rollover", "--at", "2026-03-20T00:00:00Z"], environment: env)
            #expect(rolled == 0)
            #expect(rollOut.contains("moved 1 companies, 0 to default plan, 0 unchanged"))
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2)

            let (clean, cleanOut) = try await SDKTests.run(Self.binary, ["verify"], environment: env)
            #expect(clean == 0, "\(cleanOut)")
            try await h.exec("UPDATE company_usage SET used = used + 2 WHERE company_id = '\(company.text)'")
            let (dirty, dirtyOut) = try await SDKTests.run(Self.binary, ["verify"], environment: env)
            #expect(dirty == 1)
            #expect(dirtyOut.contains("mismatch: company \(company.text)"))
            let (badAt, _) = try await SDKTests.run(Self.binary, ["rollover", "--at", "someday"], environment: env)
            #expect(badAt == 2)
        }
    }

    @Test("capgate db starts a cluster and writes its URL; capgate mock answers the Messages API; both stop on SIGTERM")
    func dbAndMock() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        let folder = NSTemporaryDirectory() + "capgate-db-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let db = try ChildProcess(
            Self.binary, ["db", "--directory", folder + "/pg", "--url-file", folder + "/url"], output: .null, errors: .null)
        defer { db.terminate() }
        var url: String?
        for _ in 0..<120 where url == nil {
            url = try? String(contentsOfFile: folder + "/url", encoding: .utf8)
            if url == nil { try await Task.sleep(for: .milliseconds(250)) }
        }
        let text = try #require(url)
        let lines = try await CapGateRunner.migrate(url: try DatabaseURL(text), dryRun: true, logger: TestCluster.logger)
        #expect(lines.contains("would apply 0030_baseline"))
        db.terminate()
        #expect(await db.wait(timeout: .seconds(20)) != nil, "capgate db still runs 20 s after SIGTERM")
        #expect(!FileManager.default.fileExists(atPath: folder + "/pg/data/postmaster.pid"))

        let port = try EmbeddedPostgres.freePort()
        let mock = try ChildProcess(Self.binary, ["mock", "--port", String(port)], output: .null, errors: .null)
        defer { mock.terminate() }
        var status: HTTPResponseStatus?
        for _ in 0..<80 where status == nil {
            status = try? await Harness.http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/models"), timeout: .seconds(2))
                .status
            if status == nil { try await Task.sleep(for: .milliseconds(250)) }
        }
        #expect(status == .ok)
    }

    @Test("capgate mock --lean answers a message, a stream (chunked SSE) and the model list, and SIGTERM ends it every time")
    func leanMock() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        // Several starts: a SIGTERM it missed (as it did, about one run in four under this suite,
        // while it caught the signal with Dispatch sources) has that many chances to show.
        for round in 0..<4 {
            let port = try EmbeddedPostgres.freePort()
            let mock = try ChildProcess(Self.binary, ["mock", "--lean", "--port", String(port)], output: .null, errors: .null)
            defer { mock.terminate(signal: SIGKILL) }
            let base = "http://127.0.0.1:\(port)"
            var models: HTTPClientResponse?
            for _ in 0..<80 where models == nil {
                models = try? await Harness.http.execute(HTTPClientRequest(url: base + "/v1/models"), timeout: .seconds(2))
                if models == nil { try await Task.sleep(for: .milliseconds(250)) }
            }
            #expect(models?.status == .ok)
            if round == 0 {
                try await checkLeanMockAnswers(base)
            }
            mock.terminate()
            let ended = await mock.wait(timeout: .seconds(10))
            #expect(ended != nil, "round \(round): still running 10 s after SIGTERM: \(Self.signalState(mock.pid))")
        }
    }

    /// State and signal masks of `pid`, for a failure message.
    static func signalState(_ pid: Int32) -> String {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        return status.split(separator: "\n").filter { $0.hasPrefix("State") || $0.hasPrefix("Sig") || $0.hasPrefix("Shd") }
            .joined(separator: "; ")
    }

    private func checkLeanMockAnswers(_ base: String) async throws {
        func post(_ body: String) async throws -> (HTTPClientResponse, String) {
            var request = HTTPClientRequest(url: base + "/v1/messages")
            request.method = .POST
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
            let response = try await Harness.http.execute(request, timeout: .seconds(10))
            return (response, String(buffer: try await response.body.collect(upTo: 1 << 20)))
        }
        let (message, messageText) = try await post(#"{"model":"claude-x","max_tokens":8,"messages":[]}"#)
        #expect(message.status == .ok)
        let json = try JSON.parse(Array(messageText.utf8))
        #expect(json["model"]?.stringValue == "claude-x")
        #expect(json["usage"]?["output_tokens"]?.intValue == 7)
        let (stream, streamText) = try await post(#"{"model":"claude-x","stream":true,"messages":[]}"#)
        #expect(stream.headers.first(name: "transfer-encoding") == "chunked")
        #expect(stream.headers.first(name: "content-type") == "text/event-stream")
        #expect(streamText.hasPrefix("event: message_start"))
        #expect(streamText.contains("event: message_stop"))
    }

    @Test("capgate serve on SIGTERM stops taking calls, finishes a stream in flight, settles its charge and exits 0")
    func serveDrainsOnSIGTERM() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let port = try EmbeddedPostgres.freePort()
            let environment = [
                "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port),
                "OPERATOR_TOKEN": "op_drain-operator-token-for-the-tests",
                "LOG_LEVEL": "warning", "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            ]
            let serve = try ChildProcess(Self.binary, ["serve"], environment: environment, output: .null, errors: .null)
            defer { serve.terminate() }
            let base = "http://127.0.0.1:\(port)"
            let ready = try await Harness.ready(base)
            try #require(ready)

            try await Self.drainsOnSIGTERM(serve, base: base, key: users[0].key, company: company, h)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
        }
    }

    /// SIGTERM to `serve` while a stream runs through it: the stream ends whole, the process
    /// exits 0, and the call is charged and settled once.
    static func drainsOnSIGTERM(_ serve: ChildProcess, base: String, key: String, company: UUID, _ h: Harness) async throws {
        let text = try await streamWhileTerminating(serve, base: base, key: key)
        #expect(text.contains("event: message_stop"))
        #expect(await serve.wait(timeout: .seconds(30)) == 0, "serve did not exit 0 within 30 s of SIGTERM")
        #expect(
            try await h.scalar(
                """
                SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'
                   AND upstream_status = 200 AND output_tokens IS NOT NULL AND settled_at IS NOT NULL
                """) == 1)
    }

    /// A stream of ~10 events 150 ms apart through `base`, with SIGTERM sent to `serve` once its
    /// first bytes arrived; checks that no new call is taken while it drains. The stream's text.
    static func streamWhileTerminating(_ serve: ChildProcess, base: String, key: String) async throws -> String {
        var request = HTTPClientRequest(url: base + "/v1/messages")
        request.method = .POST
        request.headers.add(name: "x-api-key", value: key)
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "x-mock-chunk-delay-ms", value: "150")
        request.body = .bytes(
            ByteBuffer(string: #"{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#))
        let response = try await Harness.http.execute(request, timeout: .seconds(30))
        #expect(response.status == .ok)
        var text = ""
        var signalled = false
        for try await chunk in response.body {
            text += String(buffer: chunk)
            if !signalled {
                serve.terminate()
                signalled = true
                try await Task.sleep(for: .milliseconds(300))
                // Draining: no new call is taken.
                let late = try? await Harness.http.execute(HTTPClientRequest(url: base + "/healthz"), timeout: .seconds(2))
                #expect(late?.status != .ok)
            }
        }
        #expect(signalled)
        return text
    }

    @Test(
        "serve refuses an operator token under 32 characters (OPERATOR_TOKEN, or one of OPERATOR_TOKENS) as it refuses a short JWT_SECRET: exit 2, one line naming the key, never the token"
    )
    func shortSecretsStopTheStart() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        let short = "op-" + String(repeating: "q", count: 28)  // 31 characters
        let long = "deploy-" + UUID().uuidString
        // Everything else the start needs is there: the token is what stops it.
        let base = [
            "DATABASE_URL": "postgres://capgate@127.0.0.1:9/none", "UPSTREAM_URL": "http://127.0.0.1:9", "HTTP_PORT": "0",
            "OPERATOR_TOKEN": "", "OPERATOR_TOKENS": "", "JWT_SECRET": "",
        ]
        let cases: [([String: String], String)] = [
            (
                ["OPERATOR_TOKEN": short],
                "configuration error: operator.token (OPERATOR_TOKEN) is 31 characters long; an operator token must be at least 32 characters"
            ),
            (
                ["OPERATOR_TOKENS": "deploy:\(long),ci:\(short)"],
                "configuration error: operator.tokens (OPERATOR_TOKENS) has the token named 'ci' 31 characters long; an operator token must be at least 32 characters"
            ),
            (
                ["OPERATOR_TOKEN": long, "JWT_SECRET": short],
                "configuration error: jwt.secret (JWT_SECRET) is 31 bytes long; an HS256 secret must be at least 32 bytes"
            ),
        ]
        for (environment, expected) in cases {
            let (status, output) = try await SDKTests.run(
                Self.binary, ["serve", "--config", "/nonexistent.json"], environment: base.merging(environment) { _, new in new })
            #expect(status == 2, "\(output)")
            #expect(output.trimmingCharacters(in: .whitespacesAndNewlines) == expected)
            #expect(!output.contains(short) && !output.contains(long))
        }
    }

    @Test("OPERATOR_TOKENS as SPEC §7 writes it (name:token,name:token): each named token is the operator, and no token is logged")
    func namedOperatorTokensFromEnvironment() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the binary first: swift build")
        try await Harness.with { h in
            let port = try EmbeddedPostgres.freePort()
            let ci = "ci-" + UUID().uuidString
            let deploy = "deploy-" + UUID().uuidString
            let log = FileManager.default.temporaryDirectory.appendingPathComponent("capgate-tokens-\(UUID().uuidString).log")
            defer { try? FileManager.default.removeItem(at: log) }
            let environment = [
                "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port),
                "OPERATOR_TOKENS": "ci:\(ci),deploy:\(deploy)", "LOG_LEVEL": "warning",
                "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            ]
            let serve = try ChildProcess(Self.binary, ["serve"], environment: environment, output: .file(log.path), errors: .sameAsOutput)
            defer { serve.terminate() }
            let base = "http://127.0.0.1:\(port)"
            try #require(try await Harness.ready(base))
            for (token, status) in [(ci, 200), (deploy, 200), (deploy + "x", 401), ("ci:" + ci, 401)] {
                var request = HTTPClientRequest(url: base + "/admin/v1/companies")
                request.headers.add(name: "authorization", value: "Bearer \(token)")
                let reply = try await Harness.http.execute(request, timeout: .seconds(10))
                _ = try await reply.body.collect(upTo: 1 << 20)
                #expect(Int(reply.status.code) == status, "token \(token.prefix(4))…")
            }
            serve.terminate()
            _ = await serve.wait(timeout: .seconds(30))
            let text = String(decoding: try Data(contentsOf: log), as: UTF8.self)
            // The two failures are logged (SPEC §7), with the client and without the token.
            #expect(text.components(separatedBy: "operator authentication failed").count - 1 == 2, "\(text)")
            #expect(text.contains("client=127.0.0.1"), "\(text)")
            #expect(!text.contains(ci) && !text.contains(deploy))
        }
    }
}
