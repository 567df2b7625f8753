import Foundation
import PostgresNIO
import Testing

@testable import CapGate

/// deploy/prometheus/capgate-rules.yml and deploy/grafana/capgate-dashboard.json: loaded by
/// promtool (Debian's `prometheus` package; `.ci/run` installs it) and a JSON parser, and every
/// metric they name is one a running gateway exports.
@Suite("Monitoring files", .timeLimit(.minutes(5)))
struct MonitoringFilesTests {
    static let rules = "deploy/prometheus/capgate-rules.yml"
    static let rulesTests = "deploy/prometheus/capgate-rules.test.yml"
    static let dashboard = "deploy/grafana/capgate-dashboard.json"

    static func text(_ path: String) throws -> String {
        try String(contentsOf: SDKTests.root.appendingPathComponent(path), encoding: .utf8)
    }

    /// Every `capgate_…` identifier in `text`: in an expression, a label matcher, a variable's
    /// query or a description alike, so that no name escapes the check.
    static func metricNames(in text: String) -> Set<String> {
        Set(text.matches(of: /capgate_[a-z0-9_]*[a-z0-9]/).map { String($0.output) })
    }

    /// The sample names in Prometheus text (a histogram's `_bucket`, `_sum` and `_count` as such).
    static func exportedNames(in exposition: String) -> Set<String> {
        Set(
            exposition.split(separator: "\n").compactMap { line -> String? in
                guard !line.hasPrefix("#"), let end = line.firstIndex(where: { $0 == "{" || $0 == " " }) else { return nil }
                return String(line[..<end])
            })
    }

    @Test("the names found in a file: inside functions, label matchers and histogram suffixes; nothing else")
    func namesFound() {
        let expression = #"histogram_quantile(0.99, sum by (le) (rate(capgate_a_seconds_bucket{job=~"$job"}[5m]))) / capgate_b"#
        #expect(Self.metricNames(in: expression) == ["capgate_a_seconds_bucket", "capgate_b"])
        #expect(Self.metricNames(in: "`capgate unsettled list`, CapGateNoWritableDatabase, capgate-gateways").isEmpty)
        let exposition = "# TYPE capgate_x histogram\ncapgate_x_bucket{le=\"1\"} 2\ncapgate_x_sum 1\ncapgate_y 0\n"
        #expect(Self.exportedNames(in: exposition) == ["capgate_x_bucket", "capgate_x_sum", "capgate_y"])
    }

    @Test("promtool: the rules file is valid and its unit tests pass (503 rate, spool, no writable database, webhooks, unsettled)")
    func promtool() async throws {
        let (checked, checkOutput) = try await SDKTests.run("promtool", ["check", "rules", Self.rules])
        #expect(checked == 0, "promtool check rules (Debian's prometheus package, installed by .ci/run): \(checkOutput)")
        #expect(checkOutput.contains("SUCCESS: 7 rules found"), "\(checkOutput)")
        let (tested, testOutput) = try await SDKTests.run("promtool", ["test", "rules", Self.rulesTests])
        #expect(tested == 0, "\(testOutput)")
        #expect(testOutput.contains("SUCCESS"), "\(testOutput)")
    }

    @Test("the dashboard: a Grafana model with a Prometheus data source variable; every panel has a query")
    func dashboardModel() throws {
        let data = Data(try Self.text(Self.dashboard).utf8)
        let model = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let variables = try #require((model["templating"] as? [String: Any])?["list"] as? [[String: Any]])
        #expect(variables.contains { $0["type"] as? String == "datasource" && $0["query"] as? String == "prometheus" })
        let panels = try #require(model["panels"] as? [[String: Any]])
        #expect(panels.count >= 10)
        for panel in panels {
            let title = panel["title"] as? String ?? "?"
            let targets = panel["targets"] as? [[String: Any]] ?? []
            #expect(!targets.isEmpty, "panel \(title) has no target")
            for target in targets {
                #expect(!(target["expr"] as? String ?? "").isEmpty, "panel \(title): a target without expr")
            }
            #expect((panel["datasource"] as? [String: Any])?["uid"] as? String == "${datasource}", "panel \(title)")
        }
    }

    @Test("every metric the rules and the dashboard name is one a running gateway exports")
    func namesExported() async throws {
        let used = [Self.rules, Self.dashboard].map { (file: $0, names: Self.metricNames(in: (try? Self.text($0)) ?? "")) }
        for (file, names) in used { #expect(names.count >= 7, "\(file): \(names.sorted())") }
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            // A charged call and a refunded one, so that the counters with labels exist.
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.message(key: users[0].key, headers: [("x-mock-status", "500")]).status == 500)
            // The gauges read from the database appear after their jobs' first run, at start.
            var exported: Set<String> = []
            var missing: [(String, [String])] = []
            for _ in 0..<50 {
                exported = Self.exportedNames(in: try await h.request(.GET, "/metrics", headers: h.asOperator).body)
                missing = used.map { ($0.file, $0.names.subtracting(exported).sorted()) }.filter { !$0.1.isEmpty }
                if missing.isEmpty { break }
                try await Task.sleep(for: .milliseconds(200))
            }
            #expect(missing.isEmpty, "not exported: \(missing); /metrics has \(exported.sorted())")
        }
    }

    @Test("the gauges the alerts read: capgate_db_writable (1 on the primary, 0 when read-only), capgate_unsettled_charges")
    func alertGauges() async throws {
        try await Harness.with { h in
            let text = try await h.request(.GET, "/metrics", headers: h.asOperator).body
            #expect(text.contains("\ncapgate_db_writable 1"), "\(text.split(separator: "\n").filter { $0.contains("writable") })")
            #expect(text.contains("\ncapgate_unsettled_charges 0"))
            // A session that may not write (as on a standby, or a database set read-only).
            var configuration = h.databaseURL.clientConfiguration(maxConnections: 1)
            configuration.options.additionalStartupParameters.append(("default_transaction_read_only", "on"))
            let readOnly = PostgresClient(configuration: configuration, backgroundLogger: TestCluster.logger)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await readOnly.run() }
                defer { group.cancelAll() }
                let logger = TestCluster.logger
                #expect(await Database(client: readOnly, timeout: .seconds(30), logger: logger).acceptsWrites() == false)
                #expect(await Database(client: h.db, timeout: .seconds(30), logger: logger).acceptsWrites())
            }
            // Charges stranded 3 and 2 hours ago count; one of a minute ago is still pending.
            try await h.createPlan("low", company: 100, user: 100)
            let yesterday = Timestamp.format(Date().addingTimeInterval(-86_400))
            let (company, users) = try await h.createCompany(plan: "low", users: 1, startedAt: yesterday)
            for hours in [3.0, 2.0, 0.0] {
                _ = try await UnsettledTests.strandedCharge(h, company: company, user: users[0].id, hoursAgo: hours)
            }
            let totals = try await UnsettledCharges(database: Database(client: h.db, timeout: .seconds(30), logger: TestCluster.logger))
                .totals()
            #expect(totals.count == 2)
            #expect(abs(totals.oldestSeconds - 3 * 3600) < 120, "\(totals.oldestSeconds)")
        }
    }
}
