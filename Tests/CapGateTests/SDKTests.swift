import CapGate
import Foundation
import Testing

@Suite("Official SDK and tooling", .timeLimit(.minutes(5)))
struct SDKTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Runs a program to completion on a thread of its own (never blocking the cooperative pool,
    /// which serves the gateway under test in this same process); returns exit code and output.
    static func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) async throws -> (Int32, String) {
        try await withCheckedThrowingContinuation { continuation in
            let thread = Thread {
                continuation.resume(with: Result { try runBlocking(executable, arguments, environment: environment) })
            }
            thread.start()
        }
    }

    static func runBlocking(_ executable: String, _ arguments: [String], environment: [String: String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [executable] + arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        process.currentDirectoryURL = root
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try EmbeddedPostgres.spawnLock.withLock { _ in try process.run() }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
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

    @Test("sources follow .swift-format (swift format lint --strict)")
    func formatted() async throws {
        let (status, output) = try await Self.run("swift-format", ["lint", "--strict", "--recursive", "Sources", "Tests", "Package.swift"])
        #expect(status == 0, "\(output)")
    }
}
