import AsyncHTTPClient
import CapGate
import Foundation
import NIOCore
import Testing

/// SPEC §11's promise under load: a budget is never exceeded. 64 concurrent callers over two
/// gateways on one database, half of them streaming, with random prompt sizes and `max_tokens`,
/// spend a company budget (and their users' own) that runs out mid-run; a sampler reads the
/// counters all along.
@Suite("Cost budgets under concurrency", .timeLimit(.minutes(5)))
struct CostOvershootTests {
    static let companyBudget: Int64 = 400_000
    static let userBudget: Int64 = 90_000

    @Test("64 callers, two gateways, half streaming: settled plus held never above a budget, the sum of costs within it")
    func neverExceeded() async throws {
        let seed = UInt64.random(in: 1...UInt64.max)
        try await Harness.with { first in
            try await first.createBudgetPlan(
                "p", company: 100_000, user: 100_000, companyBudget: Self.companyBudget, userBudget: Self.userBudget)
            let (company, users) = try await first.createCompany(plan: "p", users: 8)
            try await Harness.with(database: first.databaseURL) { second in
                // Every committed state, read as often as the machine allows while the calls run.
                let sampler = Task { () -> (samples: Int, company: Int64, user: Int64) in
                    var samples = 0
                    var company: Int64 = 0
                    var user: Int64 = 0
                    while !Task.isCancelled {
                        do {
                            company = max(company, try await first.scalar("SELECT max(cost_used + cost_held) FROM company_usage"))
                            user = max(user, try await first.scalar("SELECT max(cost_used + cost_held) FROM user_usage"))
                            samples += 1
                        } catch {
                            break
                        }
                    }
                    return (samples, company, user)
                }
                let counts = try await withThrowingTaskGroup(of: [Int].self) { group in
                    for caller in 0..<64 {
                        let base = caller % 2 == 0 ? first.gatewayURL : second.gatewayURL
                        let key = users[caller % users.count].key
                        group.addTask {
                            var random = SeededGenerator(state: seed &+ UInt64(caller))
                            var statuses: [Int] = []
                            for _ in 0..<8 {
                                statuses.append(
                                    try await Self.call(first, base: base, key: key, stream: caller % 4 < 2, random: &random))
                            }
                            return statuses
                        }
                    }
                    var counts: [Int: Int] = [:]
                    for try await statuses in group {
                        for status in statuses { counts[status, default: 0] += 1 }
                    }
                    return counts
                }
                sampler.cancel()
                let seen = await sampler.value
                #expect(counts[200, default: 0] > 0 && counts[402, default: 0] > 0, "seed \(seed): \(counts)")
                #expect(counts[200, default: 0] + counts[402, default: 0] == 512, "seed \(seed): \(counts)")
                #expect(seen.samples > 20, "seed \(seed): only \(seen.samples) samples")
                #expect(seen.company <= Self.companyBudget, "seed \(seed)")
                #expect(seen.user <= Self.userBudget, "seed \(seed)")
                // Every call a provider served is charged, and nothing else (each gateway has its own provider).
                let charged = try await first.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'")
                #expect(charged == Int64(first.mock.served.count + second.mock.served.count), "seed \(seed)")
                #expect(charged == Int64(counts[200, default: 0]), "seed \(seed)")
            }
            // Every call settled from its usage; the counters are the ledger's sums.
            let charged = try await first.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'")
            #expect(
                try await first.eventually(
                    "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND cost_source = 'usage'", equals: charged) == charged)
            let spent = try await first.scalar("SELECT sum(cost_micros) FROM usage_ledger WHERE outcome = 'charged'")
            #expect(spent > 0 && spent <= Self.companyBudget, "seed \(seed)")
            #expect(try await first.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(company.text)'") == spent)
            #expect(try await first.scalar("SELECT sum(cost_held) FROM company_usage") == 0)
            #expect(try await first.scalar("SELECT sum(cost_held) FROM user_usage") == 0)
            #expect(try await first.scalar("SELECT sum(cost_used) FROM user_usage") == spent)
            #expect(
                try await first.scalar(
                    "SELECT count(*) FROM (SELECT user_id FROM usage_ledger WHERE outcome = 'charged' GROUP BY user_id "
                        + "HAVING sum(cost_micros) > \(Self.userBudget)) s") == 0)
        }
    }

    /// One call with a random prompt (10 to 4,000 bytes of text) and `max_tokens` (16 to 2,000),
    /// whose provider bills a random output up to `max_tokens`; a streamed one read to its end.
    static func call(_ h: Harness, base: String, key: String, stream: Bool, random: inout SeededGenerator) async throws -> Int {
        let maxTokens = Int.random(in: 16...2_000, using: &random)
        let output = Int.random(in: 1...maxTokens, using: &random)
        let text = String(repeating: "w", count: Int.random(in: 10...4_000, using: &random))
        var request = HTTPClientRequest(url: base + "/v1/messages")
        request.method = .POST
        request.headers.add(name: "x-api-key", value: key)
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "x-mock-output-tokens", value: String(output))
        request.body = .bytes(ByteBuffer(string: CostBudgetTests.body(text: text, maxTokens: maxTokens, stream: stream)))
        let response = try await Harness.http.execute(request, timeout: .seconds(60))
        for try await _ in response.body {}
        return Int(response.status.code)
    }
}
