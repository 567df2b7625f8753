import CapGate
import Foundation
import Testing

/// `Idempotency-Key` as a hostile client would use it (SPEC §2): a retry never buys a second
/// answer for one charge. Every test ends with the invariant behind them all: calls the provider
/// served == calls the ledger charged (replays are served from storage, not by the provider).
@Suite("Idempotency-Key against a hostile client", .serialized, .timeLimit(.minutes(10)))
struct IdempotencyTests {
    static func used(_ h: Harness, _ company: UUID) async throws -> Int64 {
        try await h.scalar("SELECT coalesce(sum(used), 0) FROM company_usage WHERE company_id = '\(company.text)'")
    }

    /// Calls the provider served == ledger rows that stand charged, and counters agree with the ledger.
    static func expectInvariant(_ h: Harness, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let charged = try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'")
        #expect(Int64(h.mock.served.count) == charged, sourceLocation: sourceLocation)
        #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty, sourceLocation: sourceLocation)
    }

    @Test("ten retries of one key after a success: one upstream call, one charge, nine stored replays (user cap 1)")
    func replaysAfterSuccess() async throws {
        try await Harness.with { h in
            try await h.createPlan("tiny", company: 100, user: 1)
            let (company, users) = try await h.createCompany(plan: "tiny", users: 2)
            var bodies: [String] = []
            for i in 0..<10 {
                let reply = try await h.message(key: users[0].key, headers: [("idempotency-key", "same")])
                #expect(reply.status == 200)
                #expect(reply.headers.first(name: "idempotent-replayed") == (i == 0 ? nil : "true"))
                #expect(reply.headers.first(name: "content-type")?.contains("application/json") == true)
                bodies.append(reply.body)
            }
            #expect(Set(bodies).count == 1)
            #expect(h.mock.counter.count == 1)
            #expect(try await Self.used(h, company) == 1)
            // The user's cap of 1 is spent: a call without the key is refused, the key still replays.
            #expect(try await h.message(key: users[0].key).status == 402)
            #expect(try await h.message(key: users[0].key, headers: [("idempotency-key", "same")]).status == 200)
            #expect(h.mock.counter.count == 1)

            // Another body under the same key: 422, nothing forwarded, nothing charged.
            let other = try await h.message(key: users[0].key, model: "claude-other", headers: [("idempotency-key", "same")])
            #expect(other.status == 422)
            #expect(other.json["error"]?["type"]?.stringValue == "idempotency_key_reused")
            // Another path or query under the same key: also another request.
            let query = try await h.request(
                .POST, "/v1/messages?beta=true", headers: [("x-api-key", users[0].key), ("idempotency-key", "same")],
                json: .obj([
                    "model": "claude-test", "max_tokens": 16, "stream": false,
                    "messages": .array([.obj(["role": "user", "content": "Hello"])]),
                ]))
            #expect(query.status == 422)

            // Another user of the company, same key and body: a key of their own, charged for themselves.
            let second = try await h.message(key: users[1].key, headers: [("idempotency-key", "same")])
            #expect(second.status == 200)
            #expect(second.headers.first(name: "idempotent-replayed") == nil)
            #expect(h.mock.counter.count == 2)
            #expect(try await Self.used(h, company) == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE idempotency_key = 'same'") == 2)
            try await Self.expectInvariant(h)
        }
    }

    @Test("the same key while the first attempt is in flight: 409 idempotency_conflict with Retry-After: 1, then the replay")
    func inFlight() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let key = users[0].key
            async let first = h.message(key: key, headers: [("idempotency-key", "slow-1"), ("x-mock-delay-ms", "1500")])
            #expect(try await h.eventually("SELECT count(*) FROM idempotency_keys WHERE key = 'slow-1'", equals: 1) == 1)
            let conflict = try await h.message(key: key, headers: [("idempotency-key", "slow-1")])
            #expect(conflict.status == 409)
            #expect(conflict.json["error"]?["type"]?.stringValue == "idempotency_conflict")
            #expect(conflict.headers.first(name: "retry-after") == "1")
            #expect(try await first.status == 200)
            let replay = try await h.message(key: key, headers: [("idempotency-key", "slow-1")])
            #expect(replay.status == 200)
            #expect(replay.headers.first(name: "idempotent-replayed") == "true")
            #expect(h.mock.counter.count == 1)
            #expect(try await Self.used(h, company) == 1)
            try await Self.expectInvariant(h)
        }
    }

    @Test("200 concurrent callers with one key: exactly one reaches the provider and one charge stands")
    func concurrentSameKey() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<200 {
                    group.addTask {
                        try await h.message(key: users[0].key, headers: [("idempotency-key", "burst"), ("x-mock-delay-ms", "200")]).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses.allSatisfy { $0 == 200 || $0 == 409 })
            #expect(statuses.filter { $0 == 200 }.count >= 1)
            #expect(h.mock.counter.count == 1)
            #expect(try await Self.used(h, company) == 1)
            try await Self.expectInvariant(h)
        }
    }

    @Test("a failed attempt (refunded) and its retry: a new attempt, charged once in total")
    func failedThenRetried() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let key = users[0].key
            let failed = try await h.message(key: key, headers: [("idempotency-key", "f-1"), ("x-mock-status", "500")])
            #expect(failed.status == 500)
            #expect(try await Self.used(h, company) == 0)
            #expect(try await h.text("SELECT state FROM idempotency_keys WHERE key = 'f-1'") == "failed")
            let retry = try await h.message(key: key, headers: [("idempotency-key", "f-1")])
            #expect(retry.status == 200)
            #expect(retry.headers.first(name: "idempotent-replayed") == nil)
            let again = try await h.message(key: key, headers: [("idempotency-key", "f-1")])
            #expect(again.headers.first(name: "idempotent-replayed") == "true")
            #expect(h.mock.counter.count == 2)
            #expect(try await Self.used(h, company) == 1)
            #expect(
                try await h.text("SELECT string_agg(outcome, ',' ORDER BY id) FROM usage_ledger WHERE idempotency_key = 'f-1'")
                    == "refunded,charged")
            // The provider was asked twice; the failure was refunded, the success stands.
            try await Self.expectInvariant(h)
        }
    }

    @Test("a streamed answer is replayed byte for byte; an answer over proxy.idempotencyMaxBytes is not kept (409 on retry)")
    func streamsAndLimits() async throws {
        try await Harness.with(settings: ["proxy.idempotencyMaxBytes": "4096"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let key = users[0].key
            let first = try await h.message(key: key, stream: true, headers: [("idempotency-key", "s-1")])
            #expect(first.status == 200)
            let replay = try await h.message(key: key, stream: true, headers: [("idempotency-key", "s-1")])
            #expect(replay.status == 200)
            #expect(replay.headers.first(name: "idempotent-replayed") == "true")
            #expect(replay.headers.first(name: "content-type")?.hasPrefix("text/event-stream") == true)
            #expect(replay.body == first.body)
            #expect(first.body.contains("message_stop"))

            let large = try await h.message(key: key, headers: [("idempotency-key", "big-1"), ("x-mock-bytes", "20000")])
            #expect(large.status == 200)
            let notKept = try await h.message(key: key, headers: [("idempotency-key", "big-1"), ("x-mock-bytes", "20000")])
            #expect(notKept.status == 409)
            #expect(notKept.json["error"]?["type"]?.stringValue == "idempotency_conflict")
            #expect(notKept.json["error"]?["message"]?.stringValue?.contains("4096") == true)
            #expect(h.mock.counter.count == 2)
            #expect(try await Self.used(h, company) == 2)
            try await Self.expectInvariant(h)
        }
    }

    @Test("a key of 256 characters or with a control character is 400; keys are forgotten after 24 hours")
    func keyFormAndLifetime() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let key = users[0].key
            let long = try await h.message(key: key, headers: [("idempotency-key", String(repeating: "k", count: 256))])
            #expect(long.status == 400)
            #expect(long.json["error"]?["type"]?.stringValue == "invalid_request_error")
            #expect(try await h.message(key: key, headers: [("idempotency-key", String(repeating: "k", count: 255))]).status == 200)
            let tab = try await h.message(key: key, headers: [("idempotency-key", "a\tb")])
            #expect(tab.status == 400)
            #expect(h.mock.counter.count == 1)

            #expect(try await h.message(key: key, headers: [("idempotency-key", "old-1")]).status == 200)
            // A day later the key is forgotten: the purge deletes it, and a retry is a new request.
            try await h.exec("UPDATE idempotency_keys SET created_at = created_at - interval '25 hours' WHERE key = 'old-1'")
            #expect(try await h.scalar("SELECT capgate_idempotency_purge(now(), 100)") == 1)
            #expect(try await h.scalar("SELECT count(*) FROM idempotency_keys WHERE key = 'old-1'") == 0)
            let fresh = try await h.message(key: key, headers: [("idempotency-key", "old-1")])
            #expect(fresh.status == 200)
            #expect(fresh.headers.first(name: "idempotent-replayed") == nil)
            // An expired key not yet purged is forgotten all the same.
            try await h.exec("UPDATE idempotency_keys SET created_at = created_at - interval '25 hours' WHERE key = 'old-1'")
            let other = try await h.message(key: key, model: "claude-other", headers: [("idempotency-key", "old-1")])
            #expect(other.status == 200)
            #expect(h.mock.counter.count == 4)
            #expect(try await Self.used(h, company) == 4)
            try await Self.expectInvariant(h)
        }
    }
}
