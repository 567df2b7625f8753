import AsyncHTTPClient
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import PostgresNIO
import ServiceLifecycle
import Synchronization

@testable import CapGate
@testable import CapGateDev

/// A running gateway on a fresh database, with the mock provider, for one test.
struct Harness: Sendable {
    let databaseURL: DatabaseURL
    let gatewayURL: String
    let mockURL: String
    let operatorToken: String
    let db: PostgresClient
    let mock: MockProvider

    static let http = HTTPClient(
        eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
        configuration: .init(
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(5), read: .seconds(60)),
            connectionPool: .init(idleTimeout: .seconds(30), concurrentHTTP1ConnectionsPerHostSoftLimit: 600)
        )
    )

    /// The same client for a gateway that serves HTTPS (`http.tls.*` set): it trusts
    /// ``TestPKI``'s CA, whose `localhost` certificate also names 127.0.0.1.
    static let https = HTTPClient(
        eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
        configuration: .init(
            tlsConfiguration: {
                var tls = TLSConfiguration.makeClientConfiguration()
                tls.trustRoots = .certificates([try! TestPKI.shared.ca.nioCertificate])
                return tls
            }(),
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(5), read: .seconds(60)),
            connectionPool: .init(idleTimeout: .seconds(30))
        )
    )

    /// The client for `url`: ``https`` for an `https` URL, else ``http``.
    static func client(for url: String) -> HTTPClient { url.hasPrefix("https:") ? https : http }

    /// Starts a mock provider and a gateway on a fresh database, runs `body`, stops both.
    /// With `http.tls.certificate` and `http.tls.key` in `settings`, `gatewayURL` is
    /// `https://127.0.0.1:…` and ``request(_:_:headers:json:body:base:)`` trusts ``TestPKI``'s CA.
    /// `gatewayLogger` (default: the tests' logger) is the gateway's, for tests that read its lines.
    static func with(
        database: DatabaseURL? = nil,
        upstreamURL: String? = nil,
        settings: [String: String] = [:],
        gatewayLogger: Logger? = nil,
        _ body: @Sendable (Harness) async throws -> Void
    ) async throws {
        let url: DatabaseURL
        if let database { url = database } else { url = try await TestCluster.freshDatabase() }
        let logger = TestCluster.logger
        let mock = MockProvider()
        let (mockPort, mockPortContinuation) = AsyncStream.makeStream(of: Int.self)
        let mockApp = mock.buildApplication(port: 0, logger: logger) { channel in
            mockPortContinuation.yield(channel.localAddress?.port ?? 0)
        }
        let operatorToken = "op-test-" + UUID().uuidString
        var mockIterator = mockPort.makeAsyncIterator()
        var flags: [String: String] = [:]
        let spoolFolder = NSTemporaryDirectory() + "capgate-spool-" + UUID().uuidString
        let (gatewayPort, gatewayContinuation) = AsyncStream.makeStream(of: Int.self)
        let db = PostgresClient(configuration: url.clientConfiguration(maxConnections: 4), backgroundLogger: logger)

        // Everything runs in one service group and is shut down gracefully at the end, as
        // SIGTERM would: in-flight requests finish before the servers stop.
        let lifecycle = LifecycleLog()
        try await withThrowingTaskGroup(of: Void.self) { group in
            let mockGroup = Self.serviceGroup([mockApp, db], logger: lifecycle.logger("mock group"))
            group.addTask {
                // A group that ends before its server listens ends the wait for the port.
                defer { mockPortContinuation.finish() }
                try await mockGroup.run()
            }
            guard let mockPortNumber = await mockIterator.next() else {
                try await group.waitForAll()
                throw HarnessError.notStarted("the mock provider")
            }
            let mockURL = "http://127.0.0.1:\(mockPortNumber)"

            flags = [
                "http.port": "0", "database.url": url.text, "upstream.url": upstreamURL ?? mockURL,
                "operator.token": operatorToken, "upstream.apiKey": "provider-secret-key", "database.maxConnections": "12",
                // The whole suite shares two cores: a database call can take seconds while the
                // concurrency tests run. Tests of the timeout itself set their own.
                "database.timeout": "30",
                // Each gateway its own spool (a shared one would hold other tests' writes).
                "spool.directory": spoolFolder,
            ]
            flags.merge(settings) { _, new in new }
            let configuration = try await CapGateConfiguration.load(flags: flags, environment: [:], file: "/nonexistent/capgate.json")
            // To see which of the gateway's own services (server, settlements, upstream client,
            // pool) a stuck shutdown waits on, pass `lifecycle.logger("gateway")` here: it found
            // the settlement flush once, but it turns on debug logging in the whole gateway.
            let gateway = try await buildApplication(configuration: configuration, logger: gatewayLogger ?? logger) { channel in
                gatewayContinuation.yield(channel.localAddress?.port ?? 0)
            }
            let gatewayGroup = Self.serviceGroup([gateway], logger: lifecycle.logger("gateway group"))
            group.addTask {
                defer { gatewayContinuation.finish() }
                try await gatewayGroup.run()
            }
            var gatewayIterator = gatewayPort.makeAsyncIterator()
            guard let gatewayPortNumber = await gatewayIterator.next() else {
                await mockGroup.triggerGracefulShutdown()
                try await group.waitForAll()
                throw HarnessError.notStarted("the gateway")
            }
            let scheme = configuration.http.tls == nil ? "http" : "https"
            let gatewayURL = "\(scheme)://127.0.0.1:\(gatewayPortNumber)"

            let harness = Harness(
                databaseURL: url, gatewayURL: gatewayURL, mockURL: mockURL, operatorToken: operatorToken, db: db, mock: mock
            )
            var failure: (any Error)?
            do {
                try await body(harness)
            } catch {
                failure = error
            }
            await gatewayGroup.triggerGracefulShutdown()
            await mockGroup.triggerGracefulShutdown()
            // A shutdown that takes long says which services were asked to stop and did not.
            let watchdog = Task {
                try await Task.sleep(for: .seconds(20))
                lifecycle.report("the harness's shutdown is still running after 20 s")
            }
            defer { watchdog.cancel() }
            try await group.waitForAll()
            // The default spool folder is the harness's own (one empty folder per test otherwise
            // stays in the temporary directory); a test's own spool.directory is left to it.
            if settings["spool.directory"] == nil { try? FileManager.default.removeItem(atPath: spoolFolder) }
            if let failure { throw failure }
        }
    }

    /// A service group whose shutdown is bounded: a service still running 30 s after the
    /// graceful shutdown began is cancelled, and one that ignores cancellation for another 30 s
    /// stops the test process with a message naming the group, instead of a run that never ends.
    static func serviceGroup(_ services: [any Service], logger: Logger) -> ServiceGroup {
        var configuration = ServiceGroupConfiguration(services: services, logger: logger)
        configuration.maximumGracefulShutdownDuration = .seconds(30)
        configuration.maximumCancellationDuration = .seconds(30)
        return ServiceGroup(configuration: configuration)
    }

    enum HarnessError: Error {
        case notStarted(String)
    }

    // MARK: HTTP

    struct Reply: Sendable {
        var status: Int
        var headers: HTTPHeaders
        var body: String
        var json: JSON { (try? JSON.parse(Array(body.utf8))) ?? .null }
    }

    func request(
        _ method: HTTPMethod, _ path: String, headers: [(String, String)] = [], json: JSON? = nil, body: String? = nil,
        base: String? = nil
    ) async throws -> Reply {
        var request = HTTPClientRequest(url: (base ?? gatewayURL) + path)
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let json {
            request.headers.replaceOrAdd(name: "content-type", value: "application/json")
            request.body = .bytes(json.byteBuffer())
        } else if let body {
            request.body = .bytes(ByteBuffer(string: body))
        }
        let response = try await Self.client(for: request.url).execute(request, timeout: .seconds(60))
        let bytes = try await response.body.collect(upTo: 64 << 20)
        return Reply(status: Int(response.status.code), headers: response.headers, body: String(buffer: bytes))
    }

    /// A raw `POST /v1/messages` with a key, for tests that read the answer as a stream.
    func streamingRequest(key: String, headers: [(String, String)], body: String) -> HTTPClientRequest {
        var request = HTTPClientRequest(url: gatewayURL + "/v1/messages")
        request.method = .POST
        request.headers.add(name: "x-api-key", value: key)
        request.headers.add(name: "content-type", value: "application/json")
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        request.body = .bytes(ByteBuffer(string: body))
        return request
    }

    var asOperator: [(String, String)] { [("authorization", "Bearer \(operatorToken)")] }

    func op(_ method: HTTPMethod, _ path: String, _ json: JSON? = nil) async throws -> Reply {
        try await request(method, path, headers: asOperator, json: json)
    }

    /// A Messages API call with a key.
    func message(
        key: String, stream: Bool = false, model: String = "claude-test", headers: [(String, String)] = [], base: String? = nil
    ) async throws -> Reply {
        try await request(
            .POST, "/v1/messages", headers: [("x-api-key", key), ("anthropic-version", "2023-06-01")] + headers,
            json: .obj([
                "model": .string(model), "max_tokens": 16, "stream": .bool(stream),
                "messages": .array([.obj(["role": "user", "content": "Hello"])]),
            ]),
            base: base
        )
    }

    // MARK: fixtures through the operator API

    func createPlan(_ id: String, company: Int64?, user: Int64?, isDefault: Bool = false, sort: Int64 = 0) async throws {
        let reply = try await op(
            .POST, "/admin/v1/plans",
            .obj([
                "id": .string(id), "name": .string(id.capitalized), "monthly_company_cap": JSON(company),
                "monthly_user_cap": JSON(user), "price": 10, "currency": "USD", "is_default": .bool(isDefault),
                "is_active": true, "sort_order": .int(sort),
            ])
        )
        precondition(reply.status == 201, "plan create failed: \(reply.body)")
    }

    /// The price book's test row (`CostBudgetTests.priceRow`) and plan `id` with unit caps and cost
    /// budgets (micro-dollars; nil: none).
    func createBudgetPlan(_ id: String, company: Int64?, user: Int64?, companyBudget: Int64?, userBudget: Int64?) async throws {
        try await exec(CostBudgetTests.priceRow)
        try await createPlan(id, company: company, user: user)
        try await exec(
            "UPDATE plans SET monthly_company_budget = \(companyBudget.map(String.init) ?? "NULL"), "
                + "monthly_user_budget = \(userBudget.map(String.init) ?? "NULL") WHERE id = '\(id)'")
    }

    /// A company on `plan` with `users` members, each with one API key.
    func createCompany(
        plan: String?, users: Int, role: String = "member", startedAt: String? = nil
    ) async throws -> (company: UUID, users: [(id: UUID, key: String)]) {
        var body: [JSON.Field] = [.init("name", "Test Co"), .init("plan", JSON(plan))]
        if let startedAt { body.append(.init("started_at", .string(startedAt))) }
        let reply = try await op(.POST, "/admin/v1/companies", .object(body))
        precondition(reply.status == 201, "company create failed: \(reply.body)")
        let company = UUID(uuidString: reply.json["id"]!.stringValue!)!
        var made: [(UUID, String)] = []
        for i in 0..<users {
            let user = try await createUser(company: company, role: i == 0 ? role : "member")
            made.append(user)
        }
        return (company, made)
    }

    func createUser(company: UUID, role: String = "member", cap: Int64? = nil) async throws -> (id: UUID, key: String) {
        let reply = try await op(
            .POST, "/admin/v1/companies/\(company.uuidString.lowercased())/users",
            .obj(["email": .string("u\(UUID().uuidString.prefix(8))@example.com"), "role": .string(role), "monthly_cap": JSON(cap)])
        )
        precondition(reply.status == 201, "user create failed: \(reply.body)")
        let user = UUID(uuidString: reply.json["id"]!.stringValue!)!
        let key = try await op(
            .POST, "/admin/v1/companies/\(company.uuidString.lowercased())/api-keys",
            .obj(["user_id": .string(user.uuidString.lowercased())]))
        precondition(key.status == 201, "key create failed: \(key.body)")
        return (user, key.json["key"]!.stringValue!)
    }

    /// Waits up to 30 s for a gateway at `base` to answer `/readyz` with 200.
    static func ready(_ base: String) async throws -> Bool {
        for _ in 0..<120 {
            if (try? await client(for: base).execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)).status) == .ok {
                return true
            }
            try await Task.sleep(for: .milliseconds(250))
        }
        return false
    }

    // MARK: direct SQL checks

    func scalar(_ sql: String) async throws -> Int64 {
        let rows = try await db.query(PostgresQuery(unsafeSQL: "SELECT (" + sql + ")::bigint"), logger: TestCluster.logger)
        for try await value in rows.decode(Int64?.self) { return value ?? 0 }
        return 0
    }

    func text(_ sql: String) async throws -> String? {
        let rows = try await db.query(PostgresQuery(unsafeSQL: "SELECT (" + sql + ")::text"), logger: TestCluster.logger)
        for try await value in rows.decode(String?.self) { return value }
        return nil
    }

    /// Polls `sql` until it yields `expected` (for what the gateway writes after answering,
    /// such as token counts); returns the last value read.
    func eventually(_ sql: String, equals expected: Int64, within limit: Duration = .seconds(10)) async throws -> Int64 {
        let deadline = ContinuousClock.now + limit
        while true {
            let value = try await scalar(sql)
            if value == expected || ContinuousClock.now > deadline { return value }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Runs a script, statement by statement (the extended protocol takes one at a time).
    func exec(_ sql: String) async throws {
        for statement in SQLSplitter.statements(in: sql) {
            _ = try await db.query(PostgresQuery(unsafeSQL: statement), logger: TestCluster.logger).collect()
        }
    }
}

extension UUID {
    var text: String { uuidString.lowercased() }
}

/// The service groups' own messages (a service started, was asked to stop, finished), kept in
/// memory and printed only when a shutdown does not finish.
final class LifecycleLog: Sendable {
    private let lines = Mutex<[String]>([])

    func logger(_ group: String) -> Logger {
        Logger(label: "lifecycle") { label in Handler(group: group, log: self, critical: StreamLogHandler.standardError(label: label)) }
    }

    func append(_ line: String) {
        lines.withLock {
            $0.append(line)
            if $0.count > 400 { $0.removeFirst($0.count - 300) }
        }
    }

    func report(_ title: String) {
        let text = lines.withLock { $0.suffix(60).joined(separator: "\n") }
        FileHandle.standardError.write(Data("\(title):\n\(text)\n".utf8))
    }

    struct Handler: LogHandler {
        let group: String
        let log: LifecycleLog
        var critical: StreamLogHandler
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .debug

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            if event.level == .critical { critical.log(event: event) }
            // Only ServiceLifecycle's messages: a service starting, asked to stop, finished.
            let text = event.message.description
            guard text.contains("ervice") || text.contains("hutdown") else { return }
            let service = (event.metadata?["sl-service"] ?? self.metadata["sl-service"]).map { " \($0):" } ?? ""
            log.append("\(Date()) \(group)\(service) \(text)")
        }
    }
}
