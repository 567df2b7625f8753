import CapGate
import Foundation
import Testing

@Suite("Exact admission under concurrency", .timeLimit(.minutes(5)))
struct ConcurrencyTests {
    /// Fires `count` calls at once, spread over `keys` and `gateways`; returns status counts.
    static func burst(_ h: Harness, keys: [String], count: Int, gateways: [String]) async throws -> [Int: Int] {
        try await withThrowingTaskGroup(of: Int.self) { group in
            for i in 0..<count {
                let key = keys[i % keys.count]
                let base = gateways[i % gateways.count]
                group.addTask {
                    try await h.request(
                        .POST, "/v1/messages", headers: [("x-api-key", key)],
                        json: .obj(["model": "m", "max_tokens": 5, "messages": .array([])]), base: base
                    ).status
                }
            }
            var counts: [Int: Int] = [:]
            for try await status in group { counts[status, default: 0] += 1 }
            return counts
        }
    }

    @Test("company cap 50, 500 simultaneous calls from 25 users: exactly 50 admitted")
    func companyCap() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 50, user: 1000)
            let (company, users) = try await h.createCompany(plan: "p", users: 25)
            let counts = try await Self.burst(h, keys: users.map(\.key), count: 500, gateways: [h.gatewayURL])
            #expect(counts[200] == 50)
            #expect(counts[402] == 450)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 50)
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'") == 50)
            #expect(try await h.scalar("SELECT sum(used) FROM user_usage WHERE company_id = '\(company.text)'") == 50)
        }
    }

    @Test("user cap 30 inside a company cap of 1000, 300 simultaneous calls: exactly 30 admitted")
    func userCap() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1000, user: 30)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let counts = try await Self.burst(h, keys: [users[0].key], count: 300, gateways: [h.gatewayURL])
            #expect(counts[200] == 30)
            #expect(counts[402] == 270)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE company_id = '\(company.text)'") == 30)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 30)
        }
    }

    @Test("relaxed durability (synchronous_commit off for admissions) stays exact: API keys and JWTs, cap 20, 200 calls")
    func relaxedStaysExact() async throws {
        let secret = "relaxed-test-secret-0123456789-abcdefgh"
        try await Harness.with(settings: ["database.durability": "relaxed", "jwt.secret": secret]) { h in
            try await h.createPlan("p", company: 20, user: 1000)
            let (company, users) = try await h.createCompany(plan: "p", users: 5)
            let counts = try await Self.burst(h, keys: users.map(\.key), count: 150, gateways: [h.gatewayURL])
            let token = try await JWTTests.hs256(
                TestClaims(sub: users[0].id.text, exp: JWTTests.inAnHour, company_id: company.text), secret: secret)
            var jwtAdmitted = 0
            for _ in 0..<50 {
                let reply = try await h.request(
                    .POST, "/v1/messages", headers: [("authorization", "Bearer \(token)")], json: .obj(["model": "m", "max_tokens": 5])
                )
                if reply.status == 200 { jwtAdmitted += 1 }
            }
            #expect((counts[200] ?? 0) + jwtAdmitted == 20)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 20)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 20)
        }
    }

    @Test("two gateways on one database: cap 40, 400 calls split between them, exactly 40 admitted")
    func twoGateways() async throws {
        try await Harness.with { first in
            try await first.createPlan("p", company: 40, user: 1000)
            let (company, users) = try await first.createCompany(plan: "p", users: 10)
            try await Harness.with(database: first.databaseURL) { second in
                let counts = try await Self.burst(
                    first, keys: users.map(\.key), count: 400, gateways: [first.gatewayURL, second.gatewayURL]
                )
                #expect(counts[200] == 40)
                #expect(counts[402] == 360)
            }
            #expect(try await first.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 40)
            #expect(try await first.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 40)
        }
    }
}
