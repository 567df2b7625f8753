import CapGate
import CapGateDev
import Foundation
import Testing

@Suite("Official SDK and tooling", .timeLimit(.minutes(5)))
struct SDKTests {
    /// The repository root.
    static let root = PythonTools.root

    /// Runs a program (looked up in the `PATH` of `environment` over this process's) to its end in
    /// the repository root; its exit status, and its output and errors together. It is killed past
    /// `timeout` (or when the test is cancelled, as its time limit does), and that throws.
    static func run(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(300)
    ) async throws -> (Int32, String) {
        try await run(
            URL(fileURLWithPath: "/usr/bin/env"), [executable] + arguments,
            environment: ProcessInfo.processInfo.environment.merging(environment) { _, new in new }, folder: root, timeout: timeout,
            name: executable)
    }

    /// Runs `executable` in `folder` with exactly `environment` to its end (a ``ChildProcess``:
    /// its end is seen by a thread of its own, no thread of the pool blocks); its exit status, and
    /// its output and errors together.
    static func run(
        _ executable: URL, _ arguments: [String], environment: [String: String], folder: URL, timeout: Duration = .seconds(300),
        name: String? = nil
    ) async throws -> (Int32, String) {
        let child = try await ChildProcess.run(
            executable.path, arguments, environment: environment, directory: folder.path, name: name, timeout: timeout)
        return (child.status ?? ChildProcess.lostStatus, child.outputText)
    }

    @Test("the Anthropic Python SDK: a normal answer, a streamed answer, and APIStatusError 402 at the cap")
    func anthropicSDK() async throws {
        let python = try await PythonTools.python()
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 3)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            let (status, output) = try await Self.run(
                python, [Self.root.appendingPathComponent("Tests/sdk/anthropic_sdk_check.py").path],
                environment: ["CAPGATE_URL": h.gatewayURL, "CAPGATE_KEY": users[0].key]
            )
            #expect(status == 0, "\(output)")
            #expect(output.contains("sdk ok"))
        }
    }

    @Test("the Anthropic Python SDK with features on: models and count_tokens free, messages counted per feature, 402 and 400 surfaced")
    func anthropicSDKWithFeatures() async throws {
        let python = try await PythonTools.python()
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            try await FeatureAdmissionTests.seed(h, plan: "low", daily: 2)
            try await h.exec("INSERT INTO plan_features (plan_id, feature_id) VALUES ('low', 'chat')")
            let (status, output) = try await Self.run(
                python, [Self.root.appendingPathComponent("Tests/sdk/anthropic_sdk_features.py").path],
                environment: ["CAPGATE_URL": h.gatewayURL, "CAPGATE_KEY": users[0].key]
            )
            #expect(status == 0, "\(output)")
            #expect(output.contains("sdk features ok"))
            let c = company.text
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == 3)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)' AND units = 0") == 4)
            #expect(
                try await h.scalar(
                    "SELECT used FROM company_feature_usage WHERE company_id = '\(c)' AND feature_id = 'analysis' AND span = 'day'") == 2)
        }
    }

    @Test("the Anthropic Python SDK with a cost budget: answers within it, 402 budget_exceeded and an unpriced model's 400 surfaced")
    func anthropicSDKWithBudget() async throws {
        let python = try await PythonTools.python()
        try await Harness.with { h in
            try await h.createBudgetPlan("low", company: 100, user: 100, companyBudget: 10_000, userBudget: nil)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let (status, output) = try await Self.run(
                python, [Self.root.appendingPathComponent("Tests/sdk/anthropic_sdk_budget.py").path],
                environment: ["CAPGATE_URL": h.gatewayURL, "CAPGATE_KEY": users[0].key]
            )
            #expect(status == 0, "\(output)")
            #expect(output.contains("sdk budget ok"))
            let c = company.text
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 2) == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(c)'") == 2)
            #expect(try await h.scalar("SELECT cost_held FROM company_usage WHERE company_id = '\(c)'") == 0)
        }
    }

    @Test("the Anthropic Python SDK under a concurrency limit: it retries a 429 by itself and then succeeds")
    func anthropicSDKWithRateLimit() async throws {
        let python = try await PythonTools.python()
        try await Harness.with { h in
            try await h.createPlan("low", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "low", .obj(["user_concurrency": 1]))
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            let (status, output) = try await Self.run(
                python, [Self.root.appendingPathComponent("Tests/sdk/anthropic_sdk_rate.py").path],
                environment: ["CAPGATE_URL": h.gatewayURL, "CAPGATE_KEY": users[0].key]
            )
            #expect(status == 0, "\(output)")
            #expect(output.contains("sdk rate ok"))
            // Three calls answered (the slow stream twice, the retried call once); no 429 charged.
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 3)
            #expect(try await h.eventually("SELECT count(*) FROM rate_calls WHERE scopes & 4 <> 0", equals: 0) == 0)
        }
    }

    @Test("sources follow .swift-format (swift format lint --strict)")
    func formatted() async throws {
        let (status, output) = try await Self.run("swift-format", ["lint", "--strict", "--recursive", "Sources", "Tests", "Package.swift"])
        #expect(status == 0, "\(output)")
    }
}
