import AsyncHTTPClient
import Foundation
import NIOCore
import Synchronization
import Testing

@testable import CapGate

/// SPEC §14's windows that a call holds while it runs: the user's calls in flight, and the token
/// windows, which hold a call's bound until its answer ends and then keep its real count.
@Suite("Rate windows: calls in flight and tokens", .timeLimit(.minutes(5)))
struct RateInFlightTests {
    static let body = #"{"model":"claude-test","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"Hello"}]}"#

    /// A streamed call whose provider sends an event every `delay` ms, answered up to its head.
    static func slowStream(_ h: Harness, key: String, delay: Int = 400) async throws -> HTTPClientResponse {
        let request = h.streamingRequest(key: key, headers: [("x-mock-chunk-delay-ms", String(delay))], body: body)
        return try await Harness.http.execute(request, timeout: .seconds(60))
    }

    static func drain(_ response: HTTPClientResponse) async throws {
        for try await _ in response.body {}
    }

    /// A slow streamed call on a raw connection (an event every 3 s: it lasts about 40 s, longer
    /// than the test takes to reach its end under the whole suite's load), sent and left running.
    static func slowCall(_ h: Harness, key: String) async throws -> RawConnection {
        let port = try #require(URL(string: h.gatewayURL)?.port)
        let connection = try await RawConnection.open(port: port)
        try await connection.send(
            "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: \(key)\r\ncontent-type: application/json\r\n"
                + "x-mock-chunk-delay-ms: 3000\r\ncontent-length: \(body.utf8.count)\r\n\r\n\(body)")
        return connection
    }

    @Test(
        "user_concurrency 3: a fourth call waits for 429 (Retry-After 1); a call that ends or fails frees its slot, one that loses its client once the provider's stream is drained or cut"
    )
    func concurrency() async throws {
        // A stream whose client left is read on for 10 s at most (its usage), then its row goes.
        try await Harness.with(settings: ["costs.drainSeconds": "10"]) { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 3]))
            let (_, users) = try await h.createCompany(plan: "p", users: 2)
            let key = users[0].key
            let slots = "SELECT count(*) FROM rate_calls WHERE scopes & 4 <> 0"
            var slow: [RawConnection] = []
            for _ in 0..<3 { slow.append(try await Self.slowCall(h, key: key)) }
            defer { for connection in slow { connection.close() } }
            #expect(try await h.eventually(slots, equals: 3) == 3)

            let refused = try await h.message(key: key)
            #expect(refused.status == 429)
            #expect(refused.headers.first(name: "retry-after") == "1")
            let rate = refused.json["usage"]?["rate"]
            #expect(rate?["window"]?.stringValue == "user-concurrency")
            #expect(rate?["limit"]?.intValue == 3 && rate?["used"]?.intValue == 3)
            #expect(refused.json["error"]?["type"]?.stringValue == "rate_limit_error")
            let check = try await h.request(.GET, "/v1/usage/check", headers: [("x-api-key", key)]).json
            #expect(check["allowed"]?.boolValue == false && check["reason"]?.stringValue == "rate_limit_error")
            #expect(check["usage"]?["rate"]?["window"]?.stringValue == "user-concurrency")
            // Another user of the company has slots of its own.
            #expect(try await h.message(key: users[1].key).status == 200)
            let other = try await h.request(.GET, "/v1/usage/check", headers: [("x-api-key", users[1].key)]).json
            #expect(other["allowed"]?.boolValue == true && other["reason"] == .null)

            // A client that leaves does not free its slot while the provider's stream is read on
            // for its usage (up to costs.drainSeconds, 10 s, from when the gateway finds the client
            // gone, at its next event, within 3 s): the provider still runs the call. Once the
            // stream is drained or cut it is.
            slow.removeFirst().close()
            let closed = ContinuousClock.now
            #expect(try await h.message(key: key).status == 429)
            #expect(try await h.eventually(slots, equals: 2, within: .seconds(40)) == 2)
            // Never before the drain's 10 s (the client's close is found at an event, 0–6 s on,
            // and the drain counts from then): a slot freed when the client left would be earlier.
            let held = ContinuousClock.now - closed
            #expect(held >= .milliseconds(9_500), "the slot was freed \(held) after the client left")
            // A call the provider fails is refunded and frees its slot before its answer.
            #expect(try await h.message(key: key, headers: [("x-mock-status", "500")]).status == 500)
            #expect(try await h.scalar(slots) == 2)
            // A stream read to its end frees its slot for the next call at once (its end rides the
            // gateway's next admission), and in the database within milliseconds.
            let streamed = try await Self.slowStream(h, key: key, delay: 0)
            #expect(streamed.status == .ok)
            try await Self.drain(streamed)
            // A usage read at once counts it ended (the gateway writes the ends it noted first).
            let after = try await h.request(.GET, "/v1/usage/check", headers: [("x-api-key", key)]).json
            #expect(after["allowed"]?.boolValue == true, "\(after)")
            let fits = try await h.message(key: key)
            #expect(fits.status == 200)
            #expect(fits.headers.first(name: "ratelimit")?.contains("\"user-concurrency\";r=0") == true)
            #expect(try await h.eventually(slots, equals: 2) == 2)

            for connection in slow { connection.close() }
            #expect(try await h.eventually(slots, equals: 0, within: .seconds(40)) == 0)
            #expect(try await h.eventually("SELECT count(*) FROM rate_calls", equals: 0) == 0)
        }
    }

    @Test("a stream that runs past rate.leaseSeconds keeps its slot while its gateway runs (the lease is renewed); its end frees it")
    func longStreamKeepsSlot() async throws {
        try await Harness.with(settings: ["rate.leaseSeconds": "2"]) { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 1]))
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            #expect(try await h.eventually("SELECT slot_lease_seconds FROM config_versions", equals: 2) == 2)
            // Its events 1 s apart: about 7 s in all, past three leases.
            let stream = try await Self.slowStream(h, key: key, delay: 1000)
            #expect(stream.status == .ok)
            let started = ContinuousClock.now
            try await Task.sleep(for: .seconds(4))
            let refused = try await h.message(key: key)
            #expect(refused.status == 429, "\(refused.body)")
            #expect(refused.json["usage"]?["rate"]?["window"]?.stringValue == "user-concurrency")
            #expect(try await h.scalar("SELECT count(*) FROM rate_calls WHERE lease_until > now()") == 1)
            try await Self.drain(stream)
            // The stream outlived its first lease: this test says nothing if it ended too soon.
            #expect(ContinuousClock.now - started > .seconds(4))
            #expect(try await h.message(key: key).status == 200)
        }
    }

    @Test(
        "each slot keeps the lease of the gateway that holds it: a gateway started later with rate.leaseSeconds 2 does not cut a 600 s gateway's running stream's slot"
    )
    func leasePerGateway() async throws {
        try await Harness.with { a in
            try await a.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(a, plan: "p", .obj(["user_concurrency": 1]))
            let (_, users) = try await a.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Harness.with(database: a.databaseURL, settings: ["rate.leaseSeconds": "2"]) { b in
                // The later gateway's lease is now the database's default.
                #expect(try await a.eventually("SELECT slot_lease_seconds FROM config_versions", equals: 2) == 2)
                // A's stream, events 1 s apart (about 7 s), holds A's lease (600 s), not 2 s.
                let stream = try await Self.slowStream(a, key: key, delay: 1000)
                #expect(stream.status == .ok)
                #expect(
                    try await a.scalar("SELECT count(*) FROM rate_calls WHERE lease_until > now() + interval '300 seconds'") == 1)
                try await Task.sleep(for: .seconds(4))
                let refused = try await b.message(key: key)
                #expect(refused.status == 429, "\(refused.body)")
                #expect(refused.json["usage"]?["rate"]?["window"]?.stringValue == "user-concurrency")
                try await Self.drain(stream)
                #expect(try await a.eventually("SELECT count(*) FROM rate_calls", equals: 0) == 0)
                // B's own slots take B's lease.
                let own = try await Self.slowStream(b, key: key, delay: 1000)
                #expect(own.status == .ok)
                #expect(try await b.scalar("SELECT count(*) FROM rate_calls WHERE lease_until < now() + interval '10 seconds'") == 1)
                try await Self.drain(own)
            }
        }
    }

    @Test("lease renewal: a held slot's lease is extended; not once its end is noted, nor once its charge is gone")
    func renewalStops() async throws {
        try await Harness.with { h in
            try await BatchAdmissionTests.withMetering(h) { _, database in
                let ends = SlotEnds(database: database, gather: .seconds(600))
                let company = UUID()
                try await h.exec(
                    """
                    INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
                    SELECT '\(company.text)', i, gen_random_uuid(), '', now(), 0, 4, now() + interval '1 second'
                      FROM generate_series(1, 3) i
                    """)
                // A call's lease end, and the latest of all (what a reset left), in epoch milliseconds:
                // a renewal writes its time plus the lease (4 s here), past the reset's 1 s.
                let leaseOf = { (id: Int) in "SELECT (extract(epoch FROM lease_until) * 1000)::int8 FROM rate_calls WHERE ledger_id = \(id)"
                }
                func reset() async throws -> Int64 {
                    try await h.exec("UPDATE rate_calls SET lease_until = clock_timestamp() + interval '1 second'")
                    return try await h.scalar("SELECT (extract(epoch FROM max(lease_until)) * 1000)::int8 FROM rate_calls")
                }
                // A renewal whose write failed (a database call slowed past its limit by the whole
                // suite's load) leaves its calls due: asked again, up to three times, until call 3's is written.
                func renewDue(after base: Int64) async throws {
                    for _ in 0..<3 {
                        await ends.renew(leaseSeconds: 4)
                        if try await h.scalar(leaseOf(3)) > base + 2000 { return }
                    }
                }
                var held: [SlotLease?] = (1...3).map { ends.taken(companyID: company, ledgerID: Int64($0)) }
                var base = try await reset()
                // A quarter of a 4-second lease is 1 s: all three are due after it.
                try await Task.sleep(for: .milliseconds(1100))
                try await renewDue(after: base)
                for id in 1...3 { #expect(try await h.scalar(leaseOf(id)) > base + 2000) }
                base = try await reset()
                // Call 1 ended (noted, not yet written); call 2's charge is gone; call 3 still runs.
                ends.add(RateEnd(companyID: company, ledgerID: 1))
                held[1] = nil
                try await Task.sleep(for: .milliseconds(1100))
                try await renewDue(after: base)
                #expect(try await h.scalar(leaseOf(1)) <= base)
                #expect(try await h.scalar(leaseOf(2)) <= base)
                #expect(try await h.scalar(leaseOf(3)) > base + 2000)
                // Renewed moments ago: not due again within a quarter lease (an hour's: 15 minutes).
                base = try await reset()
                await ends.renew(leaseSeconds: 3600)
                #expect(try await h.scalar(leaseOf(3)) <= base)
                withExtendedLifetime(held) {}
            }
        }
    }

    @Test(
        "an ended call's slot is not counted by its gateway's next admissions (alone or in a batch) until its end is written, which no admission does or waits for; the noted ends are written by themselves, and before the gateway stops"
    )
    func endedSlotsNotCounted() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 1]))
            let (company, users) = try await h.createCompany(plan: "p", users: 2)
            let slots = "SELECT count(*) FROM rate_calls WHERE scopes & 4 <> 0"
            try await BatchAdmissionTests.withMetering(h) { _, database in
                // Noted ends would be written after 10 minutes: only by flush() in this test.
                let ends = SlotEnds(database: database, gather: .seconds(600))
                func admit(_ keys: [String], on gateway: SlotEnds? = nil) async -> [AdmissionRow?] {
                    await MeteringStore.admitBatch(
                        keys.map { BatchAdmissionTests.call(key: $0) }, database: database, relaxed: false, slotEnds: gateway
                    ).map { try? $0.get() }
                }
                func ended(_ row: AdmissionRow?) throws -> RateEnd {
                    RateEnd(companyID: company, ledgerID: try #require(row?.ledgerID))
                }
                // Alone (capgate_admit): the slot is taken; a second call waits for it.
                let first = await admit([users[0].key], on: ends)
                #expect(first.map { $0?.decision } == [.charged])
                #expect(await admit([users[0].key], on: ends).map { $0?.decision } == [.rateLimited])
                ends.add(try ended(first[0]))
                let second = await admit([users[0].key], on: ends)
                #expect(second.map { $0?.decision } == [.charged])
                #expect(try await h.scalar(slots) == 2)  // the first's row stays until its end is written

                // In a batch (capgate_admit_batch): both users' ended slots not counted.
                let other = await admit([users[1].key], on: ends)
                #expect(other.map { $0?.decision } == [.charged])
                ends.add([try ended(second[0]), try ended(other[0])])
                // Another gateway counts the rows until they are written.
                #expect(await admit([users[0].key]).map { $0?.decision } == [.rateLimited])
                let batch = await admit([users[0].key, users[1].key], on: ends)
                #expect(batch.map { $0?.decision } == [.charged, .charged])
                #expect(try await h.scalar(slots) == 5)
                #expect(Set(ends.excluded()) == Set([first[0], second[0], other[0]].compactMap { $0?.ledgerID }))
                await ends.flush()
                #expect(try await h.scalar(slots) == 2)
                #expect(ends.excluded().isEmpty)

                // Without an admission: one write of their own, at the latest when the gateway
                // stops (MeteringStore.flush, its graceful shutdown), however long the gather.
                let store = MeteringStore(database: database, slotEndGather: .seconds(600))
                for row in batch { store.freeSlot(companyID: company, ledgerID: try #require(row?.ledgerID)) }
                #expect(try await h.scalar(slots) == 2)
                await store.flush()
                #expect(try await h.scalar(slots) == 0)
            }
        }
    }

    @Test("an end whose write fails stays noted (this gateway does not count its slot) and is written again once the database takes it")
    func failedEndWrittenAgain() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 1]))
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await BatchAdmissionTests.withMetering(h) { _, database in
                let ends = SlotEnds(database: database, gather: .milliseconds(10), retry: .milliseconds(200))
                func admit() async -> Admission.Decision? {
                    await MeteringStore.admitBatch(
                        [BatchAdmissionTests.call(key: users[0].key)], database: database, relaxed: false, slotEnds: ends
                    )
                    .first.flatMap { try? $0.get().decision }
                }
                let first = try #require(
                    await MeteringStore.admitBatch(
                        [BatchAdmissionTests.call(key: users[0].key)], database: database, relaxed: false, slotEnds: ends
                    ).first?.get().ledgerID)
                // The end's write fails while its function raises (an error at execution: a failed
                // preparation would stay with the connection's prepared statement).
                let function = "capgate_rate_end(uuid[], bigint[])"
                let definition = try #require(try await h.text("SELECT pg_get_functiondef('\(function)'::regprocedure)"))
                try await h.exec(
                    """
                    CREATE OR REPLACE FUNCTION capgate_rate_end(p_company uuid[], p_ledger bigint[]) RETURNS void LANGUAGE plpgsql
                    AS $$ BEGIN RAISE EXCEPTION 'unavailable'; END; $$
                    """)
                ends.add(RateEnd(companyID: company, ledgerID: first))
                await ends.flush()
                #expect(ends.excluded() == [first])
                #expect(try await h.scalar("SELECT count(*) FROM rate_calls WHERE ledger_id = \(first)") == 1)
                #expect(await admit() == .charged)  // its slot is free for this gateway meanwhile
                try await h.exec(definition)
                #expect(try await h.eventually("SELECT count(*) FROM rate_calls WHERE ledger_id = \(first)", equals: 0) == 0)
                for _ in 0..<50 where !ends.excluded().isEmpty { try await Task.sleep(for: .milliseconds(20)) }
                #expect(ends.excluded().isEmpty)
            }
        }
    }

    /// What concurrent callers saw (``exactUnderLoad()``).
    final class InFlight: Sendable {
        let state = Mutex((now: 0, most: 0, charged: 0, refused: 0))
    }

    @Test(
        "user_concurrency 2, 24 callers of one user over two gateways, calls ending all the while: never more than 2 in flight, and every slot free once the ends are written"
    )
    func exactUnderLoad() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 2]))
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await BatchAdmissionTests.withMetering(h) { first, database in
                // A second gateway: its own admission queue and noted ends, on the same database.
                let second = MeteringStore(database: database, slotEndGather: .milliseconds(20))
                // Calls admitted and not yet ended (counted down before the end is noted, so never
                // more than the slots the database holds), the most seen, and the outcomes.
                let seen = InFlight()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for caller in 0..<24 {
                        let gateway = caller % 2 == 0 ? first : second
                        group.addTask {
                            for _ in 0..<12 {
                                let (_, admission) = try await gateway.admit(key: key, BatchAdmissionTests.call(key: key).request)
                                guard admission.decision == .charged, let ledger = admission.ledgerID else {
                                    #expect(admission.decision == .rateLimited)
                                    seen.state.withLock { $0.refused += 1 }
                                    try await Task.sleep(for: .milliseconds(1))
                                    continue
                                }
                                seen.state.withLock {
                                    $0.now += 1
                                    $0.most = max($0.most, $0.now)
                                    $0.charged += 1
                                }
                                // Held a while, as a call is: the other callers meet it in flight.
                                try await Task.sleep(for: .milliseconds(20))
                                seen.state.withLock { $0.now -= 1 }
                                gateway.freeSlot(companyID: company, ledgerID: ledger)
                            }
                        }
                    }
                    try await group.waitForAll()
                }
                let result = seen.state.withLock { $0 }
                // Never more than the limit. (Whether two were seen at once depends on the load: the
                // other gateway's ends count until written, ~50 ms; a fresh clone's run under the
                // whole suite's load saw one at a time. That the limit lets two through is checked
                // below, once the ends are written.)
                #expect(result.most >= 1 && result.most <= 2, "\(result)")
                // Slots were taken again after ends (more calls than slots), and the limit refused some.
                #expect(result.charged > 2 && result.refused > 0)
                await first.flush()
                await second.flush()
                #expect(try await h.scalar("SELECT count(*) FROM rate_calls") == 0)
                // Every slot free: two calls go through at once, a third waits.
                var decisions: [Admission.Decision] = []
                for gateway in [first, second, first] {
                    decisions.append(try await gateway.admit(key: key, BatchAdmissionTests.call(key: key).request).1.decision)
                }
                #expect(decisions == [.charged, .charged, .rateLimited])
            }
        }
    }

    @Test("user_tpm: a running call holds its prompt bound plus max_tokens; when its stream ends the minute keeps its real count")
    func tokens() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            // The hold: the body's bytes plus costs.promptOverheadTokens (1,000), plus max_tokens.
            let hold = Int64(Self.body.utf8.count) + 1_000 + 1_000
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_tpm": .int(hold + hold / 2)]))
            try await RateWindowTests.roomInMinute(30)
            let window = "SELECT rate_tokens FROM user_usage WHERE company_id = '\(company.text)'"

            // Its events 1.5 s apart (about 10 s in all): still running when the second call
            // arrives even under the whole suite's load (at 300 ms apart it once ended first).
            let first = try await Self.slowStream(h, key: key, delay: 1500)
            #expect(first.status == .ok)
            #expect(try await h.scalar(window) == hold)
            let second = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")], body: Self.body)
            #expect(second.status == 429)
            #expect(second.json["usage"]?["rate"]?["window"]?.stringValue == "user-tpm")
            #expect(second.json["usage"]?["rate"]?["used"]?.intValue == hold)

            try await Self.drain(first)
            // The settlement (queued) writes the same usage to the ledger.
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE settled_at IS NOT NULL", equals: 1) == 1)
            let real = try await h.scalar("SELECT input_tokens + output_tokens FROM usage_ledger")
            let counted = try await h.scalar(window)
            #expect(counted == real && counted > 0 && counted < hold)
            // The ledger row now holds the real count (what a refund would give back); a call
            // without a slot never had a rate_calls row.
            #expect(try await h.scalar("SELECT rate_tokens FROM usage_ledger") == real)
            #expect(try await h.scalar("SELECT count(*) FROM rate_calls") == 0)
            // Room again for a call of the same size.
            let again = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")], body: Self.body)
            #expect(again.status == 200)

            // A token window needs a bound: no max_tokens is 400 and changes nothing.
            let unbounded = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")],
                body: #"{"model":"claude-test","messages":[{"role":"user","content":"Hi"}]}"#)
            #expect(unbounded.status == 400)
            #expect(unbounded.json["error"]?["message"]?.stringValue?.contains("max_tokens") == true)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 2)
        }
    }
}
