import Foundation
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import CapGate

/// SPEC §2 (#26 item 3): no tenant can starve another. A body trickled a byte at a time holds
/// only the bytes it sent and gets 408 after `http.bodyTimeout`; one company holds at most
/// `proxy.companyShare` of the body budget and of the provider's connections; a client that reads
/// nothing of its answer loses it after `http.idleTimeout`, freeing the provider's connection.
/// Meanwhile another company's calls keep getting 200 within a second.
@Suite("No tenant can starve another", .timeLimit(.minutes(5)))
struct TenantIsolationTests {
    /// Every call the mock provider served is one charged ledger row, and `capgate verify` finds
    /// counters and ledger in agreement.
    static func servedIsCharged(_ h: Harness, provider: ScriptedProvider? = nil) async throws {
        let charged = "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'"
        if provider == nil {
            #expect(try await h.eventually(charged, equals: Int64(h.mock.served.count)) == Int64(h.mock.served.count))
        }
        #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome <> 'charged'") == 0)
        #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
    }

    /// `count` calls of company B, one after another, each answered 200 promptly: within a second
    /// when the suite runs alone (measured), within 5 s beside the whole parallel suite on two
    /// cores. A starved call would instead get 503 (body budget) or wait for `upstream.timeout`
    /// (600 s).
    static func otherCompanyServed(_ count: Int, _ call: () async throws -> Int) async throws {
        for _ in 0..<count {
            let started = ContinuousClock.now
            let status = try await call()
            #expect(status == 200)
            #expect(ContinuousClock.now - started < .seconds(5), "another company's call took \(ContinuousClock.now - started)")
        }
    }

    @Test("8 connections declaring 32 MB and trickling a byte at a time: 408 after http.bodyTimeout, closed, nothing charged")
    func tricklingBodies() async throws {
        try await HeavyTests.alone { try await Self.trickling() }
    }

    static func trickling() async throws {
        try await Harness.with(settings: ["http.bodyTimeout": "3", "http.idleTimeout": "60"]) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (a, usersA) = try await h.createCompany(plan: "open", users: 1)
            let (_, usersB) = try await h.createCompany(plan: "open", users: 1)
            let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
            var slow: [RawConnection] = []
            var sentAt: [ContinuousClock.Instant] = []
            for _ in 0..<8 {
                let connection = try await RawConnection.open(port: port)
                sentAt.append(.now)
                try await connection.send(OverloadTests.head(key: usersA[0].key, length: 32_000_000) + "{")
                slow.append(connection)
            }
            let trickling = slow
            defer { for connection in trickling { connection.close() } }
            let trickle = Task {
                for _ in 0..<20 {
                    try await Task.sleep(for: .milliseconds(400))
                    for connection in trickling where !connection.isClosed { try? await connection.send(" ") }
                }
            }
            defer { trickle.cancel() }
            try await Self.otherCompanyServed(10) { try await h.message(key: usersB[0].key).status }
            for (connection, sent) in zip(trickling, sentAt) {
                let answer = try #require(await connection.answer(within: .seconds(10)))
                #expect(answer.status == 408)
                #expect(answer.body.contains("request_timeout"))
                // At http.bodyTimeout (3 s) after its head, however long the trickle would go on
                // (8 s); a margin for two loaded cores.
                #expect(answer.at - sent >= .milliseconds(2900) && answer.at - sent < .seconds(7), "408 after \(answer.at - sent)")
                #expect(await connection.closed(within: .seconds(5)))
            }
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(a.text)'") == 0)
            // A body that arrives in time is unaffected.
            #expect(try await h.message(key: usersA[0].key).status == 200)
            try await Self.servedIsCharged(h)
        }
    }

    @Test("one company holds at most proxy.companyShare of the body budget: past it 503 for that company only")
    func bodyShare() async throws {
        let settings = ["proxy.bodyBudgetBytes": "1000000", "proxy.maxBodyBytes": "900000", "proxy.companyShare": "25"]
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (a, usersA) = try await h.createCompany(plan: "open", users: 1)
            let (_, usersB) = try await h.createCompany(plan: "open", users: 1)
            let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
            let big = OverloadTests.body(size: 240_000)
            // Company A's slow body holds 200 kB of its 250 kB share.
            let first = try await RawConnection.open(port: port)
            defer { first.close() }
            try await first.send(OverloadTests.head(key: usersA[0].key, length: big.utf8.count) + String(big.prefix(200_000)))
            // Time for the gateway to read it (400 ms once lost that race on two loaded cores, in a
            // full test run: the second body was read first, took the share, and waited for the
            // rest of its bytes).
            try await Task.sleep(for: .milliseconds(1500))
            // A second body of A passes the share: 503, nothing charged.
            let second = try await RawConnection.open(port: port)
            defer { second.close() }
            try await second.send(OverloadTests.head(key: usersA[0].key, length: big.utf8.count) + String(big.prefix(100_000)))
            let refused = try #require(await second.answer(within: .seconds(10)))
            #expect(refused.status == 503)
            #expect(refused.body.contains("share"))
            // Company B is not touched by A's share.
            let b = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", usersB[0].key), ("content-type", "application/json")],
                body: OverloadTests.body(size: 240_000))
            #expect(b.status == 200)
            // A's first body completes and is served.
            try await first.send(String(big.dropFirst(200_000)))
            #expect(try #require(await first.answer(within: .seconds(10))).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(a.text)'") == 1)
            try await Self.servedIsCharged(h)
        }
    }

    /// Counts the bytes a client received.
    final class ByteCounter: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let received = Atomic(0)
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received.add(unwrapInboundIn(data).readableBytes, ordering: .relaxed)
        }
    }

    /// A client that sends `request` and then reads nothing (a tiny receive buffer, no reads)
    /// until the test lets it.
    static func nonReader(port: Int, request: String) async throws -> (channel: any Channel, counter: ByteCounter) {
        let counter = ByteCounter()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelOption(.autoRead, value: false)
            .channelOption(.socketOption(.so_rcvbuf), value: 4096)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(counter) }
            }
            .connect(host: "127.0.0.1", port: port)
            .get()
        try await channel.writeAndFlush(ByteBuffer(string: request))
        return (channel, counter)
    }

    @Test(
        "4 clients that read nothing of 64 MB answers, upstream.maxConnections 4: another company keeps getting 200; each loses its answer after http.idleTimeout"
    )
    func slowReaders() async throws {
        try await HeavyTests.alone { try await Self.readers() }
    }

    /// B's calls each on a socket of its own (`RawHTTP`, `connection: close`): with `http.idleTimeout`
    /// 2 s the gateway closes a pooled keep-alive connection the test's HTTP client may pick up in
    /// the same instant (ECONNRESET, then `remoteConnectionClosed` on a connection the setup's
    /// calls left in the pool, in two fresh-clone runs: the HTTP/1.1 keep-alive race, not a starved
    /// call). A request's own `connection: close` did not help: the client still reused a pooled one.
    static func bCall(port: Int, key: String) async throws -> Int {
        try await RawHTTP.send(port: port, method: "GET", target: "/v1/keep", headers: [("x-api-key", key)]).status
    }

    static func readers() async throws {
        let provider = try await ScriptedProvider.start()
        defer { provider.stop() }
        let settings = ["upstream.maxConnections": "4", "proxy.companyShare": "25", "http.idleTimeout": "2"]
        try await Harness.with(upstreamURL: "http://127.0.0.1:\(provider.port)", settings: settings) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (a, usersA) = try await h.createCompany(plan: "open", users: 1)
            let (_, usersB) = try await h.createCompany(plan: "open", users: 1)
            let port = try #require(Int(h.gatewayURL.split(separator: ":").last ?? ""))
            var readers: [(channel: any Channel, counter: ByteCounter)] = []
            for _ in 0..<4 {
                readers.append(
                    try await Self.nonReader(
                        port: port, request: "GET /v1/huge HTTP/1.1\r\nhost: gw\r\nx-api-key: \(usersA[0].key)\r\n\r\n"))
            }
            defer { for reader in readers { reader.channel.close(promise: nil) } }
            try await Task.sleep(for: .milliseconds(500))
            // Company A holds its one share of the provider's connections; B's calls go on.
            try await Self.otherCompanyServed(10) { try await Self.bCall(port: port, key: usersB[0].key) }
            // Each of A's calls is cut after http.idleTimeout of its client reading nothing, one
            // after another as the company's connection frees; every answer the provider started
            // stays charged.
            let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(a.text)' AND outcome = 'charged'"
            #expect(try await h.eventually(charged, equals: 4, within: .seconds(40)) == 4)
            // Every one of them cut: its answer settled (the gateway ends a call, cut or not, by
            // settling it), which a fixed wait of four idle timeouts did not always see under the
            // whole suite's load (a client then read its fourth answer whole before its cut).
            let ended = charged + " AND settled_at IS NOT NULL"
            #expect(try await h.eventually(ended, equals: 4, within: .seconds(60)) == 4)
            // Reading now, each client finds its answer cut short and its connection closed.
            for reader in readers {
                do {
                    try await reader.channel.setOption(.autoRead, value: true).get()
                } catch {
                    // Already closed, or reset by the kernel because the gateway closed it with the
                    // answer unread (seen once in a fresh-clone run): closed as expected.
                    let reset = (error as? IOError)?.errnoCode == ECONNRESET
                    guard reset || error as? ChannelError == .ioOnClosedChannel else { throw error }
                }
                try await withThrowingTaskGroup(of: Bool.self) { group in
                    group.addTask {
                        try await reader.channel.closeFuture.get()
                        return true
                    }
                    group.addTask {
                        try await Task.sleep(for: .seconds(20))
                        return false
                    }
                    let closed = try await group.next()
                    #expect(closed == true, "a client that read nothing kept its connection")
                    group.cancelAll()
                }
                #expect(reader.counter.received.load(ordering: .relaxed) < 64 << 20)
            }
            #expect(provider.open.load(ordering: .relaxed) <= 4)
            try await Self.otherCompanyServed(3) { try await Self.bCall(port: port, key: usersB[0].key) }
            try await Self.servedIsCharged(h, provider: provider)
        }
    }

    @Test("CompanyShare: at most the share per company, a freed slot goes to the company's first waiter, a wait ends at its deadline")
    func shareUnit() async throws {
        let share = CompanyShare(total: 8, percent: 25)
        #expect(share.limit == 2)
        let a = UUID()
        let b = UUID()
        #expect(await share.acquire(for: a, timeout: .seconds(1)))
        #expect(await share.acquire(for: a, timeout: .seconds(1)))
        #expect(await share.acquire(for: b, timeout: .seconds(1)))
        let started = ContinuousClock.now
        #expect(await share.acquire(for: a, timeout: .milliseconds(200)) == false)
        #expect(ContinuousClock.now - started >= .milliseconds(200))
        let waiter = Task { await share.acquire(for: a, timeout: .seconds(10)) }
        try await Task.sleep(for: .milliseconds(100))
        share.give(1, for: a)
        #expect(await waiter.value)
        #expect(share.held(by: a) == 2)
        let cancelled = Task { await share.acquire(for: a, timeout: .seconds(10)) }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        #expect(await cancelled.value == false)
        #expect(share.take(1, for: b) && !share.take(1, for: b))
        do {
            let ticket = ShareTicket(share: share, company: b)
            ticket.release()
            ticket.release()
        }
        #expect(share.held(by: b) == 1)
        #expect(CompanyShare(total: 2, percent: 25).limit == 1)
    }
}
