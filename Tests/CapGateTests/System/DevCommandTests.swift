import AsyncHTTPClient
import CapGate
import CapGateDev
import Foundation
import NIOCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite("capgate dev, the real binary", .timeLimit(.minutes(5)))
struct DevCommandTests {
    @Test("serve without a required key stops with one line naming the key and its variable, exit code 2")
    func missingConfiguration() async throws {
        let binary = SDKTests.root.appendingPathComponent(".build/debug/capgate").path
        try #require(FileManager.default.isExecutableFile(atPath: binary), "build the binary first: swift build")
        let (status, output) = try await SDKTests.run(
            binary, ["serve", "--config", "/nonexistent.json"], environment: ["UPSTREAM_URL": "http://127.0.0.1:9", "DATABASE_URL": ""])
        #expect(status == 2)
        #expect(output.trimmingCharacters(in: .whitespacesAndNewlines) == "configuration error: database.url (DATABASE_URL) is required")
        let (badPort, portOutput) = try await SDKTests.run(
            binary, ["migrate", "--config", "/nonexistent.json"], environment: ["HTTP_PORT": "eighty"])
        #expect(badPort == 2)
        #expect(portOutput.contains("http.port (HTTP_PORT)"))
    }

    @Test("dev starts its own PostgreSQL and mock, answers /readyz 200, serves the demo keys, and stops cleanly on SIGINT")
    func devComesUp() async throws {
        let dev = try DevRun([], label: "dev")
        defer { dev.end() }
        let (process, folder, base, output) = (dev.process, dev.folder, dev.base, dev.output)
        var ready = false
        for _ in 0..<120 {
            if let reply = try? await Harness.http.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)),
                reply.status == .ok
            {
                ready = true
                break
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        try #require(ready, "dev did not become ready:\n\(output())")

        // The demo data works: the printed member key makes a call through the mock provider.
        let demo = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: folder + "/.capgate/demo.json"))))
        let key = demo["member_key"]!.stringValue!
        #expect(output().contains(key))
        #expect(output().contains("curl"))
        var call = HTTPClientRequest(url: base + "/v1/messages")
        call.method = .POST
        call.headers.add(name: "x-api-key", value: key)
        call.headers.add(name: "content-type", value: "application/json")
        call.body = .bytes(ByteBuffer(string: #"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#))
        let reply = try await Harness.http.execute(call, timeout: .seconds(10))
        #expect(reply.status == .ok)

        // 120 simultaneous calls on the real binary (Swift Concurrency on the event loops,
        // callers handed their batch's answer on their own loop): the demo route table makes
        // each call one `analysis`, of which the member may make 5 a day: exactly 4 more are
        // admitted, every caller gets its answer.
        let request = call
        let statuses = try await withThrowingTaskGroup(of: UInt.self) { group in
            for _ in 0..<120 {
                group.addTask { try await Harness.http.execute(request, timeout: .seconds(30)).status.code }
            }
            return try await group.reduce(into: [UInt: Int]()) { $0[$1, default: 0] += 1 }
        }
        #expect(statuses == [200: 4, 402: 116], "\(statuses)")

        // Five analyses by the member crossed 80 % and 100 % of their daily 5 (and the company's
        // 10 stays below 80 %): the admin reads those two rows; the printed text says how.
        let company = demo["company_id"]!.stringValue!
        #expect(output().contains("/admin/v1/companies/\(company)/notifications"))
        var read = HTTPClientRequest(url: base + "/admin/v1/companies/\(company)/notifications")
        read.headers.add(name: "x-api-key", value: demo["admin_key"]!.stringValue!)
        let answer = try await Harness.http.execute(read, timeout: .seconds(10))
        let notes = try JSON.parse(Array(String(buffer: try await answer.body.collect(upTo: 1 << 20)).utf8))["data"]?.arrayValue ?? []
        #expect(
            Set(
                notes.map {
                    "\($0["scope"]?.stringValue ?? "")/\($0["feature"]?.stringValue ?? "")/\($0["window"]?.stringValue ?? "")/\($0["threshold"]?.intValue ?? 0)"
                })
                == ["user/analysis/day/80", "user/analysis/day/100"], "\(notes)")

        // A month of history for the console: a past period and calls on the days before today.
        #expect(output().contains(base + "/console"))
        let adminKey = demo["admin_key"]!.stringValue!
        func adminRead(_ path: String) async throws -> JSON {
            var request = HTTPClientRequest(url: base + path)
            request.headers.add(name: "x-api-key", value: adminKey)
            let answer = try await Harness.http.execute(request, timeout: .seconds(10))
            return try JSON.parse(Array(String(buffer: try await answer.body.collect(upTo: 1 << 20)).utf8))
        }
        let history = try await adminRead("/admin/v1/companies/\(company)/usage/history")["data"]?.arrayValue ?? []
        #expect(history.count == 1 && (history.first?["used"]?.intValue ?? 0) > 20, "\(history)")
        let days = try await adminRead("/admin/v1/companies/\(company)/usage/daily").arrayValue ?? []
        let today = String(Timestamp.format(Date()).prefix(10))
        #expect(days.last?["date"]?.stringValue == today)
        if days.count > 3 { #expect(days.dropLast().filter { ($0["units"]?.intValue ?? 0) > 0 }.count >= 2, "\(days)") }

        // The price book holds the provider's list prices: the demo's claude-sonnet-4-6 is priced
        // by its family's row, long-prompt tier included.
        var pricesRead = HTTPClientRequest(url: base + "/admin/v1/prices")
        pricesRead.headers.add(name: "authorization", value: "Bearer \(demo["operator_token"]!.stringValue!)")
        let pricesAnswer = try await Harness.http.execute(pricesRead, timeout: .seconds(10))
        let book = try JSON.parse(Array(String(buffer: try await pricesAnswer.body.collect(upTo: 1 << 20)).utf8))
        let sonnet = book["prices"]?.arrayValue?.first { $0["model"]?.stringValue == "claude-sonnet-4*" }
        #expect(sonnet?["input"]?.stringValue == "3" && sonnet?["cache_write_5m"]?.stringValue == "3.75", "\(book)")
        #expect(sonnet?["long_prompt"]?["threshold_tokens"]?.intValue == 200_000, "\(book)")

        // The demo plans carry cost budgets (SPEC §11), so budgets can be tried; `low` (the demo
        // company's, whose calls above use an unpriced model) and `high` have none.
        var plansRead = HTTPClientRequest(url: base + "/admin/v1/plans")
        plansRead.headers.add(name: "authorization", value: "Bearer \(demo["operator_token"]!.stringValue!)")
        let plansAnswer = try await Harness.http.execute(plansRead, timeout: .seconds(10))
        let plans = try JSON.parse(Array(String(buffer: try await plansAnswer.body.collect(upTo: 1 << 20)).utf8))["data"]?.arrayValue ?? []
        let budgets = Dictionary(
            plans.map {
                (
                    $0["id"]?.stringValue ?? "",
                    "\($0["monthly_company_budget"]?.stringValue ?? "null")/\($0["monthly_user_budget"]?.stringValue ?? "null")"
                )
            }, uniquingKeysWith: { a, _ in a })
        #expect(budgets == ["free": "5/1", "low": "null/null", "medium": "100/20", "high": "null/null"], "\(plans)")

        process.terminate(signal: SIGINT)
        #expect(await process.wait(timeout: .seconds(15)) != nil, "dev did not stop on SIGINT")
        #expect(!FileManager.default.fileExists(atPath: folder + "/.capgate/postgres/data/postmaster.pid"), "PostgreSQL still running")
    }

    @Test("dev refuses a demo database made with other migrations and says to delete the folder; its PostgreSQL is stopped")
    func staleDemoDatabase() async throws {
        let folder = NSTemporaryDirectory() + "capgate-dev-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: folder) }
        // A demo database from a build whose baseline read differently.
        let cluster = try await offPool { try EmbeddedPostgres.start(directory: folder + "/postgres", logger: TestCluster.logger) }
        _ = try await CapGateRunner.migrate(url: cluster.url, dryRun: false, logger: TestCluster.logger)
        try await CapGateRunner.withClient(url: cluster.url, logger: TestCluster.logger) { client in
            _ = try await client.query(
                "UPDATE capgate_migrations SET checksum = 'older' WHERE version = '0030_baseline'", logger: TestCluster.logger
            )
            .collect()
        }
        cluster.stop()

        let configuration = try await CapGateConfiguration.load(flags: [:], environment: [:], file: "/nonexistent/capgate.json")
        do {
            try await DevEnvironment.run(configuration: configuration, directory: folder, logger: TestCluster.logger)
            Issue.record("dev started on a stale demo database")
        } catch {
            let text = String(describing: error)
            #expect(text.contains("0030_baseline") && text.contains("delete that folder"), "\(text)")
        }
        #expect(!FileManager.default.fileExists(atPath: cluster.dataDirectory + "/postmaster.pid"), "PostgreSQL still running")
    }
}
