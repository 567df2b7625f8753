import AsyncHTTPClient
import CapGate
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import PostgresNIO
import ServiceLifecycle

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

    /// Starts a mock provider and a gateway on a fresh database, runs `body`, stops both.
    static func with(
        database: DatabaseURL? = nil,
        upstreamURL: String? = nil,
        settings: [String: String] = [:],
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
        let (mockPortStream, _) = (mockPort, mockPortContinuation)
        var mockIterator = mockPortStream.makeAsyncIterator()
        var flags: [String: String] = [:]
        let (gatewayPort, gatewayContinuation) = AsyncStream.makeStream(of: Int.self)
        let db = PostgresClient(configuration: url.clientConfiguration(maxConnections: 4), backgroundLogger: logger)

        // Everything runs in one service group and is shut down gracefully at the end, as
        // SIGTERM would: in-flight requests finish before the servers stop.
        try await withThrowingTaskGroup(of: Void.self) { group in
            let mockGroup = ServiceGroup(services: [mockApp, db], logger: logger)
            group.addTask { try await mockGroup.run() }
            let mockURL = "http://127.0.0.1:\(await mockIterator.next()!)"

            flags = [
                "http.port": "0", "database.url": url.text, "upstream.url": upstreamURL ?? mockURL,
                "operator.token": operatorToken, "upstream.apiKey": "provider-secret-key", "database.maxConnections": "12",
            ]
            flags.merge(settings) { _, new in new }
            let configuration = try await CapGateConfiguration.load(flags: flags, environment: [:], file: "/nonexistent/capgate.json")
            let gateway = try await buildApplication(configuration: configuration, logger: logger) { channel in
                gatewayContinuation.yield(channel.localAddress?.port ?? 0)
            }
            let gatewayGroup = ServiceGroup(services: [gateway], logger: logger)
            group.addTask { try await gatewayGroup.run() }
            var gatewayIterator = gatewayPort.makeAsyncIterator()
            let gatewayURL = "http://127.0.0.1:\(await gatewayIterator.next()!)"

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
            try await group.waitForAll()
            if let failure { throw failure }
        }
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
        let response = try await Self.http.execute(request, timeout: .seconds(60))
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
    func message(key: String, stream: Bool = false, model: String = "claude-test", headers: [(String, String)] = []) async throws -> Reply {
        try await request(
            .POST, "/v1/messages", headers: [("x-api-key", key), ("anthropic-version", "2023-06-01")] + headers,
            json: .obj([
                "model": .string(model), "max_tokens": 16, "stream": .bool(stream),
                "messages": .array([.obj(["role": "user", "content": "Hello"])]),
            ])
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

    func exec(_ sql: String) async throws {
        _ = try await db.query(PostgresQuery(unsafeSQL: sql), logger: TestCluster.logger).collect()
    }
}

extension UUID {
    var text: String { uuidString.lowercased() }
}
