import AsyncHTTPClient
import CapGate
import Foundation
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
        let db = Process()
        db.executableURL = URL(fileURLWithPath: Self.binary)
        db.arguments = ["db", "--directory", folder + "/pg", "--url-file", folder + "/url"]
        db.standardOutput = FileHandle.nullDevice
        db.standardError = FileHandle.nullDevice
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try db.run()
        var url: String?
        for _ in 0..<120 where url == nil {
            url = try? String(contentsOfFile: folder + "/url", encoding: .utf8)
            if url == nil { try await Task.sleep(for: .milliseconds(250)) }
        }
        let text = try #require(url)
        let lines = try await CapGateRunner.migrate(url: try DatabaseURL(text), dryRun: true, logger: TestCluster.logger)
        #expect(lines.contains("would apply 0001_schema"))
        db.terminate()
        for _ in 0..<80 where db.isRunning { try await Task.sleep(for: .milliseconds(250)) }
        #expect(!db.isRunning)
        #expect(!FileManager.default.fileExists(atPath: folder + "/pg/data/postmaster.pid"))

        let port = try EmbeddedPostgres.freePort()
        let mock = Process()
        mock.executableURL = URL(fileURLWithPath: Self.binary)
        mock.arguments = ["mock", "--port", String(port)]
        mock.standardOutput = FileHandle.nullDevice
        mock.standardError = FileHandle.nullDevice
        try mock.run()
        defer { if mock.isRunning { mock.terminate() } }
        var status: HTTPResponseStatus?
        for _ in 0..<80 where status == nil {
            status = try? await Harness.http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/models"), timeout: .seconds(2))
                .status
            if status == nil { try await Task.sleep(for: .milliseconds(250)) }
        }
        #expect(status == .ok)
    }
}
