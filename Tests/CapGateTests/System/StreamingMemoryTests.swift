import AsyncHTTPClient
import CapGate
import Foundation
import Testing

@Suite("Streaming without buffering", .timeLimit(.minutes(5)))
struct StreamingMemoryTests {
    static func residentMiB() -> Double {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let kb = line.split(separator: " ").compactMap { Double($0) }.first ?? 0
            return kb / 1024
        }
        return 0
    }

    @Test("a 100 MB answer streams through without the process growing by anything near 100 MB")
    func hundredMegabytes() async throws {
        try await HeavyTests.alone { try await Self.streamHundredMegabytes() }
    }

    static func streamHundredMegabytes() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let request = h.streamingRequest(
                key: users[0].key, headers: [("x-mock-bytes", String(100 << 20))], body: #"{"model":"m","max_tokens":5}"#
            )
            let before = Self.residentMiB()
            let response = try await Harness.http.execute(request, timeout: .seconds(120))
            #expect(response.status == .ok)
            var total = 0
            var peak = before
            for try await chunk in response.body {
                total += chunk.readableBytes
                if total % (8 << 20) < chunk.readableBytes { peak = max(peak, Self.residentMiB()) }
            }
            #expect(total == 100 << 20)
            // The mock, the gateway and this client share the process: buffering the answer anywhere
            // would add at least 100 MiB.
            #expect(peak - before < 80, "RSS grew from \(before) to \(peak) MiB")
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
        }
    }
}
