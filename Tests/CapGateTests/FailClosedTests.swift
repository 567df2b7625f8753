import CapGate
import Foundation
import Testing

@Suite("Fail closed", .timeLimit(.minutes(5)))
struct FailClosedTests {
    @Test("database down during traffic: 503 and nothing forwarded, then recovery without a restart")
    func databaseDown() async throws {
        // A cluster of its own: this test stops it.
        let folder = NSTemporaryDirectory() + "capgate-failclosed-\(UUID().uuidString)"
        let cluster = try await offPool {
            try EmbeddedPostgres.start(directory: folder, settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: folder)
        }
        let url = cluster.url
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: TestCluster.logger)
        try await Harness.with(database: url, settings: ["database.timeout": "2"]) { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            let forwarded = h.mock.counter.count

            try await offPool { cluster.kill() }
            for _ in 0..<3 {
                let reply = try await h.message(key: users[0].key)
                #expect(reply.status == 503)
                #expect(reply.json["error"]?["type"]?.stringValue == "overloaded_error")
            }
            #expect(h.mock.counter.count == forwarded)
            let ready = try await h.request(.GET, "/readyz")
            #expect(ready.status == 503)

            try await offPool { try cluster.restart() }
            var recovered = false
            for _ in 0..<40 {
                if try await h.message(key: users[0].key).status == 200 {
                    recovered = true
                    break
                }
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(recovered)
            #expect(try await h.request(.GET, "/readyz").status == 200)
        }
    }
}
