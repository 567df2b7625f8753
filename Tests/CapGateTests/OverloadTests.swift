import CapGate
import Foundation
import NIOCore
import Synchronization
import Testing

/// Bounded waits under overload (issue #17): a call queued for admission gives up at
/// `database.timeout` from its arrival however long the queue, a full queue refuses at once, and
/// the bytes of request bodies read at once stay within `proxy.bodyBudgetBytes`.
@Suite("Overload", .timeLimit(.minutes(5)))
struct OverloadTests {
    @Test("the overload keys: defaults, environment variables, bad values named")
    func configurationKeys() async throws {
        let defaults = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent/capgate.json")
        #expect(defaults.database.admissionQueueLimit == 10_000)
        #expect(defaults.proxy.bodyBudgetBytes == 256 << 20)
        #expect(defaults.http.idleTimeout == 60)
        #expect(defaults.http.headerTimeout == 10)
        #expect(defaults.http.maxConnections == 10_000)
        let set = try await CapGateConfiguration.load(
            environment: [
                "DATABASE_ADMISSION_QUEUE_LIMIT": "50", "PROXY_BODY_BUDGET_BYTES": "1000", "HTTP_IDLE_TIMEOUT": "2.5",
                "HTTP_HEADER_TIMEOUT": "3", "HTTP_MAX_CONNECTIONS": "7",
            ], file: "/nonexistent/capgate.json")
        #expect(set.database.admissionQueueLimit == 50)
        #expect(set.proxy.bodyBudgetBytes == 1000)
        #expect(set.http.idleTimeout == 2.5)
        #expect(set.http.headerTimeout == 3)
        #expect(set.http.maxConnections == 7)
        for key in [
            "database.admissionQueueLimit", "proxy.bodyBudgetBytes", "http.idleTimeout", "http.headerTimeout", "http.maxConnections",
        ] {
            #expect(CapGateConfiguration.keys.contains(key))
        }
        for (variable, value) in [("HTTP_MAX_CONNECTIONS", "0"), ("HTTP_HEADER_TIMEOUT", "-1"), ("DATABASE_ADMISSION_QUEUE_LIMIT", "x")] {
            await #expect(throws: ConfigurationError.self) {
                _ = try await CapGateConfiguration.load(environment: [variable: value], file: "/nonexistent/capgate.json")
            }
        }
    }

    // MARK: the admission queue

    @Test("queued items give up at their wait limit, are never processed, and a full queue refuses at once")
    func queueWaitLimit() async throws {
        let processed = Mutex<[Int]>([])
        let queue = BatchQueue<Int, Int>(maxBatch: 4, waitLimit: .milliseconds(300), queueLimit: 10) { items in
            processed.withLock { $0 += items }
            // The first batch stalls well past every queued item's limit.
            if items.contains(0) { try? await Task.sleep(for: .seconds(1)) }
            return items.map { .success($0) }
        }
        let leader = Task { try await queue.submit(0) }
        for _ in 0..<200 where processed.withLock({ $0.isEmpty }) { try await Task.sleep(for: .milliseconds(5)) }

        let outcomes = try await withThrowingTaskGroup(of: (Int, Duration, BatchQueueRejection?).self) { group in
            for i in 1...10 {
                group.addTask {
                    let started = ContinuousClock.now
                    do {
                        _ = try await queue.submit(i)
                        return (i, ContinuousClock.now - started, nil)
                    } catch let rejection as BatchQueueRejection {
                        return (i, ContinuousClock.now - started, rejection)
                    }
                }
            }
            // Ten wait (the limit): the eleventh is refused at once.
            for _ in 0..<200 where queue.statistics.waiting < 10 {
                try await Task.sleep(for: .milliseconds(5))
            }
            let started = ContinuousClock.now
            await #expect(throws: BatchQueueRejection.queueFull) { try await queue.submit(11) }
            #expect(ContinuousClock.now - started < .milliseconds(100))
            return try await group.reduce(into: []) { $0.append($1) }
        }
        for (_, waited, rejection) in outcomes {
            #expect(rejection == .waitedTooLong)
            #expect(waited < .milliseconds(300 + 250))
        }
        #expect(try await leader.value == 0)
        await queue.flush()
        // Nothing that gave up while queued was processed.
        #expect(processed.withLock { $0 } == [0])
        #expect(queue.statistics.expired == 10)
        #expect(queue.statistics.rejected == 1)
    }

    @Test("an item that gave up while its batch was in flight has that batch's result handed to `late`")
    func lateResults() async throws {
        let late = Mutex<[Int]>([])
        let secondEnded = Mutex(false)
        let (leaderRunning, running) = AsyncStream.makeStream(of: Void.self)
        let queue = BatchQueue<Int, Int>(
            maxBatch: 8, waitLimit: .milliseconds(2500),
            late: { item, result in
                if case .success = result { late.withLock { $0.append(item) } }
            }
        ) { items in
            // The leader's batch takes 1 s, the next one 8 s: its items give up in flight (2.5 s after
            // they arrived, after the leader's batch, with 1.5 s to spare for a loaded machine: a
            // call arriving at an idle queue would run its own admission at once, bounded by
            // database.timeout instead).
            if items.contains(0) { running.yield() }
            try? await Task.sleep(for: items.contains(0) ? .seconds(1) : .seconds(8))
            if !items.contains(0) { secondEnded.withLock { $0 = true } }
            return items.map { .success($0) }
        }
        let leader = Task { try await queue.submit(0) }
        // The others arrive while the leader's batch is in flight, so they form the next batch.
        var signal = leaderRunning.makeAsyncIterator()
        _ = await signal.next()
        let started = ContinuousClock.now
        let results = await withTaskGroup(of: Result<Int, any Error>.self) { group in
            for i in 1...3 {
                group.addTask {
                    do { return .success(try await queue.submit(i)) } catch { return .failure(error) }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        // They gave up at 2.5 s (the failures below), while their batch was still in flight, not
        // when it ended. (A bound on the elapsed time, 5 s, failed once in a fresh-clone run: under
        // the whole suite's load on two cores the items' tasks started seconds late.)
        #expect(secondEnded.withLock { $0 } == false, "gave up after \(ContinuousClock.now - started)")
        #expect(results.allSatisfy { if case .failure(let e) = $0 { (e as? BatchQueueRejection) == .waitedTooLong } else { false } })
        #expect(try await leader.value == 0)
        await queue.flush()
        #expect(late.withLock { $0.sorted() } == [1, 2, 3])
    }

    // MARK: a stalled database with a long queue

    /// A connection the server has accepted and answered once (GET /healthz), tried again if the
    /// server's listen queue dropped it in a burst of connects.
    static func establishedConnection(port: Int) async throws -> RawConnection {
        for _ in 0..<5 {
            let connection = try await RawConnection.open(port: port)
            try await connection.send("GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            if await connection.answer(within: .seconds(20))?.status == 200 { return connection }
            connection.close()
        }
        throw RawConnectionError.notEstablished
    }

    enum RawConnectionError: Error { case notEstablished }

    @Test("stalled database, 3000 queued calls: each answered 503 by database.timeout + 2 s from its send; afterwards served == charged")
    func stalledDatabaseLongQueue() async throws {
        try await HeavyTests.alone { try await Self.stalledDatabase3000() }
    }

    static func stalledDatabase3000() async throws {
        try await FailClosedTests.withOwnCluster { cluster in
            let made = try await FailClosedTests.company(on: cluster.url, users: 2)
            // Connections are opened before the calls; under a full suite's load that can take a
            // while, so the idle timeout must not close them first.
            // database.timeout 10 s: long enough that many calls are queued together even when the
            // whole suite's load slows the sending to ~130 calls a second (seen in CI).
            let settings = ["database.timeout": "10", "http.maxConnections": "5000", "http.idleTimeout": "600"]
            try await Harness.with(database: cluster.url, settings: settings) { h in
                let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
                let calls = 3000
                // The connections first (not part of any call's time), a few hundred at a time,
                // each proven accepted by the server with a /healthz round trip.
                var connections: [RawConnection] = []
                for start in stride(from: 0, to: calls, by: 250) {
                    connections += try await withThrowingTaskGroup(of: RawConnection.self) { group in
                        for _ in start..<min(start + 250, calls) {
                            group.addTask { try await Self.establishedConnection(port: port) }
                        }
                        return try await group.reduce(into: []) { $0.append($1) }
                    }
                }
                defer { for connection in connections { connection.close() } }
                // Both keys known to the gateway (their check before the body is remembered).
                for user in made.users { #expect(try await FailClosedTests.firstSuccess(h, key: user.key, attempts: 10)) }
                let served = h.mock.counter.count

                let frozen = try ClusterFreeze(cluster)
                let body = #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#
                // 1000 calls a second: all 3000 are queued at once (the last arrives before the
                // first gives up), and the gateway's intake keeps up even in a debug build on a
                // loaded machine (a burst of 3000 at once takes it 1-2 s there just to read and
                // parse, which a call's time from its send would count).
                var sent = [ContinuousClock.Instant?](repeating: nil, count: calls)
                let slice = 50
                for start in stride(from: 0, to: calls, by: slice) {
                    let sliceStarted = ContinuousClock.now
                    let times = try await withThrowingTaskGroup(of: (Int, ContinuousClock.Instant).self) { group in
                        for i in start..<min(start + slice, calls) {
                            let connection = connections[i]
                            let key = made.users[i % 2].key
                            group.addTask {
                                let request =
                                    "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-api-key: \(key)\r\n"
                                    + "content-type: application/json\r\ncontent-length: \(body.utf8.count)\r\n\r\n\(body)"
                                let at = ContinuousClock.now
                                try await connection.send(request)
                                return (i, at)
                            }
                        }
                        return try await group.reduce(into: []) { $0.append($1) }
                    }
                    for (i, at) in times { sent[i] = at }
                    try await Task.sleep(until: sliceStarted + .milliseconds(50))
                }
                // Each answer's time is taken as it arrives; the test only looks now and then.
                let waitUntil = ContinuousClock.now + .seconds(60)
                while connections.contains(where: { !$0.hasAnswer }) && ContinuousClock.now < waitUntil {
                    try await Task.sleep(for: .milliseconds(100))
                }
                var answers: [RawConnection.Answer?] = []
                for connection in connections { answers.append(await connection.answer(within: .zero)) }
                frozen.thaw()

                let answered = answers.compactMap { $0 }
                let closedUnanswered = zip(connections, answers).filter { $0.0.isClosed && $0.1 == nil }.count
                #expect(answered.count == calls, "unanswered: \(calls - answered.count), of which closed: \(closedUnanswered)")
                #expect(answered.allSatisfy { $0.status == 503 })
                #expect(answered.allSatisfy { $0.body.contains("overloaded_error") })
                let waits = zip(sent, answers).compactMap { sent, answer -> Duration? in
                    guard let sent, let answer else { return nil }
                    return answer.at - sent
                }
                let slowest = waits.max() ?? .zero
                let sends = sent.compactMap { $0 }
                let arrivals = answered.map(\.at)
                // database.timeout is 10 s; 2 s for the answer's way back through a debug build under the
                // whole suite's load (7.03 s was seen once with a 1 s margin on a 6 s timeout).
                #expect(slowest <= .seconds(12), "the slowest call was answered \(slowest) after its send")
                // They were waiting together: at least a third were sent before the first was answered
                // (all of them, on an idle machine; under the whole suite's load, sending once went
                // at ~130 calls a second: 800 in the 6 s before the first answer).
                let first = arrivals.min()!
                let together = sends.filter { $0 < first }.count
                #expect(together >= calls / 3, "sent before the first answer: \(together), too few")
                #expect(h.mock.counter.count == served)

                // The database back: the admissions that were in flight commit and are given back;
                // every call the provider served is charged, and nothing else.
                #expect(try await FailClosedTests.firstSuccess(h, key: made.users[0].key, attempts: 40))
                let company = made.company.text
                let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company)' AND outcome = 'charged'"
                let expected = Int64(h.mock.counter.count)
                #expect(try await h.eventually(charged, equals: expected, within: .seconds(30)) == expected)
                #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company)'") == expected)
                #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            }
        }
    }

    // MARK: the body budget

    /// A Messages API body of exactly `size` bytes.
    static func body(size: Int) -> String {
        let frame = #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":""}]}"#
        let padding = String(repeating: "x", count: size - frame.utf8.count)
        return #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"\#(padding)"}]}"#
    }

    static func head(key: String, length: Int? = nil, chunked: Bool = false) -> String {
        var head = "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-api-key: \(key)\r\ncontent-type: application/json\r\n"
        if let length { head += "content-length: \(length)\r\n" }
        if chunked { head += "transfer-encoding: chunked\r\n" }
        return head + "\r\n"
    }

    @Test("the bytes of bodies being read at once stay within proxy.bodyBudgetBytes: past it 503, nothing charged or forwarded")
    func bodyBudget() async throws {
        let settings = ["proxy.bodyBudgetBytes": "1000000", "proxy.maxBodyBytes": "900000", "proxy.companyShare": "100"]
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let made = try await h.createCompany(plan: "low", users: 1)
            let key = made.users[0].key
            let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
            let served = h.mock.counter.count

            // A 600 kB body arriving slowly holds what it has sent (599 kB) while it is read.
            let big = Self.body(size: 600_000)
            let slow = try await RawConnection.open(port: port)
            defer { slow.close() }
            try await slow.send(Self.head(key: key, length: big.utf8.count) + String(big.prefix(599_000)))
            try await Task.sleep(for: .milliseconds(500))

            // A declared length holds nothing: a body that declares 900 kB and sends nothing
            // does not take the budget from anyone.
            let declared = try await RawConnection.open(port: port)
            defer { declared.close() }
            try await declared.send(Self.head(key: key, length: 900_000))
            try await Task.sleep(for: .milliseconds(200))
            #expect(try await h.message(key: key).status == 200)

            // Meanwhile another 600 kB body does not fit once what it sent passes what is left: 503.
            let second = try await RawConnection.open(port: port)
            defer { second.close() }
            try await second.send(Self.head(key: key, length: big.utf8.count) + String(big.prefix(500_000)))
            let refused = try #require(await second.answer(within: .seconds(10)))
            #expect(refused.status == 503)
            #expect(refused.body.contains("overloaded_error"))

            // Nor does a chunked one that grows past what is left (its second chunk).
            let chunked = try await RawConnection.open(port: port)
            defer { chunked.close() }
            let part = String(big.prefix(300_000))
            try await chunked.send(Self.head(key: key, chunked: true) + String(part.utf8.count, radix: 16) + "\r\n" + part + "\r\n")
            try await chunked.send(String(part.utf8.count, radix: 16) + "\r\n" + part + "\r\n")
            let refusedChunked = try #require(await chunked.answer(within: .seconds(10)))
            #expect(refusedChunked.status == 503)
            #expect(refusedChunked.body.contains("overloaded_error"))

            // A small call still fits.
            #expect(try await h.message(key: key).status == 200)

            // The slow body completes and is served; then its share is free again.
            try await slow.send(String(big.dropFirst(599_000)))
            let done = try #require(await slow.answer(within: .seconds(10)))
            #expect(done.status == 200)
            let again = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")], body: Self.body(size: 850_000))
            #expect(again.status == 200)

            // Many large bodies at once: each is served or refused 503, never anything else, and
            // every refused one was neither forwarded nor charged.
            let replies = try await withThrowingTaskGroup(of: Harness.Reply.self) { group in
                for _ in 0..<12 {
                    group.addTask {
                        try await h.request(
                            .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")],
                            body: Self.body(size: 400_000))
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(replies.allSatisfy { $0.status == 200 || $0.status == 503 })
            let ok = replies.filter { $0.status == 200 }.count
            #expect(ok >= 2)
            #expect(h.mock.counter.count == served + 4 + ok)
            let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(made.company.text)' AND outcome = 'charged'"
            #expect(try await h.eventually(charged, equals: Int64(4 + ok)) == Int64(4 + ok))
        }
    }
}
