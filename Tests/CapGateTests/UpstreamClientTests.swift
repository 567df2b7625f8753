import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import CapGate

/// CapGate's own HTTP/1.1 client against a provider that sends raw bytes.
@Suite("Upstream client", .timeLimit(.minutes(1)))
struct UpstreamClientTests {
    /// A client on a one-thread loop group, so every call uses the same connection pool.
    static func withClient(
        timeout: String = "5", idleTimeout: String = "5", _ body: (UpstreamClient, ScriptedProvider) async throws -> Void
    ) async throws {
        let provider = try await ScriptedProvider.start()
        defer { provider.stop() }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let configuration = try await CapGateConfiguration.load(
            flags: ["upstream.timeout": timeout, "upstream.idleTimeout": idleTimeout], environment: [:], file: "/nonexistent.json")
        let client = try UpstreamClient(configuration: configuration, baseURL: "http://127.0.0.1:\(provider.port)", eventLoopGroup: group)
        do {
            try await body(client, provider)
        } catch {
            try await client.shutdown()
            try await group.shutdownGracefully()
            throw error
        }
        try await client.shutdown()
        try await group.shutdownGracefully()
    }

    static func get(_ client: UpstreamClient, _ path: String, method: HTTPMethod = .GET) async throws -> UpstreamResponse {
        try await client.execute(method: method, target: path, headers: HTTPHeaders(), body: nil)
    }

    /// The whole answer to GET `path` as text; throws if it ended early.
    static func fetch(_ client: UpstreamClient, _ path: String) async throws -> String {
        let (text, failure) = await text(try await get(client, path).body)
        if let failure { throw failure }
        return text
    }

    /// Expects GET `path` to answer `expected`, whole.
    static func expectText(
        _ client: UpstreamClient, _ path: String, _ expected: String, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let text = try await fetch(client, path)
        #expect(text == expected, sourceLocation: sourceLocation)
    }

    /// The whole body as text, and why it ended early, if it did.
    static func text(_ body: UpstreamBody) async -> (String, UpstreamError?) {
        switch body {
        case .whole(let buffer, let failure):
            return (String(buffer: buffer), failure)
        case .stream(let stream):
            var all = ByteBuffer()
            do {
                for try await var chunk in stream { all.writeBuffer(&chunk) }
                return (String(buffer: all), nil)
            } catch {
                return (String(buffer: all), error as? UpstreamError)
            }
        }
    }

    /// Waits until `condition` holds (connections close asynchronously), at most 5 s.
    static func eventually(_ condition: () -> Bool) async throws -> Bool {
        for _ in 0..<100 {
            if condition() { return true }
            try await Task.sleep(for: .milliseconds(50))
        }
        return condition()
    }

    @Test("keep-alive answers reuse one connection; a HEAD answer ends at its head")
    func reuse() async throws {
        try await Self.withClient { client, provider in
            for _ in 0..<20 {
                let response = try await Self.get(client, "/keep")
                #expect(response.head.status == .ok)
                let (text, failure) = await Self.text(response.body)
                #expect(text == "ok" && failure == nil)
            }
            let head = try await Self.get(client, "/keep", method: .HEAD)
            #expect(head.head.headers.first(name: "content-length") == "2")
            let (headText, headFailure) = await Self.text(head.body)
            #expect(headText.isEmpty && headFailure == nil)
            #expect(provider.accepted.load(ordering: .relaxed) == 1)
        }
    }

    @Test("connection: close, chunked and close-delimited answers arrive whole; a closed connection is not reused")
    func framings() async throws {
        try await Self.withClient { client, provider in
            for _ in 0..<3 {
                try await Self.expectText(client, "/close", "closed")
            }
            #expect(provider.accepted.load(ordering: .relaxed) == 3)
            try await Self.expectText(client, "/chunked", "onetwothree")
            try await Self.expectText(client, "/eof", "until the end")
            // The provider closing an idle keep-alive connection is noticed: the next call opens a new one.
            try await Self.expectText(client, "/drop-idle", "ok")
            #expect(try await Self.eventually { provider.open.load(ordering: .relaxed) == 0 })
            let before = provider.accepted.load(ordering: .relaxed)
            try await Self.expectText(client, "/keep", "ok")
            #expect(provider.accepted.load(ordering: .relaxed) == before + 1)
        }
    }

    @Test("an answer that comes before the request body was sent: the connection is not reused")
    func earlyAnswer() async throws {
        try await Self.withClient { client, provider in
            let body = ByteBuffer(repeating: UInt8(ascii: "x"), count: 32 << 20)
            let early = try await client.execute(method: .POST, target: "/early", headers: HTTPHeaders(), body: body)
            #expect(early.head.status == .payloadTooLarge)
            let (text, failure) = await Self.text(early.body)
            #expect(text == "too long" && failure == nil)
            try await Self.expectText(client, "/keep", "ok")
            #expect(provider.accepted.load(ordering: .relaxed) == 2)
        }
    }

    @Test(
        "no head in time after the whole request was sent is unanswered; a body gone silent fails its stream with idleTimeout and closes the connection"
    )
    func timeouts() async throws {
        try await Self.withClient(timeout: "0.5", idleTimeout: "0.5") { client, provider in
            let start = ContinuousClock.now
            await #expect(throws: UpstreamError.unanswered) { _ = try await Self.get(client, "/slow-head") }
            // Well before the head would come (5 s), with room for a loaded machine.
            #expect(ContinuousClock.now - start < .seconds(3))
            let stalled = try await Self.get(client, "/stall")
            let (text, failure) = await Self.text(stalled.body)
            #expect(text == "0123456789")
            #expect(failure == .idleTimeout)
            #expect(try await Self.eventually { provider.open.load(ordering: .relaxed) == 0 })
            try await Self.expectText(client, "/keep", "ok")
        }
    }

    @Test("a large answer streams with back-pressure; a consumer that stops early closes the connection instead of reusing it")
    func abandonedStream() async throws {
        try await Self.withClient { client, provider in
            let big = try await Self.get(client, "/big")
            guard case .stream(let stream) = big.body else {
                Issue.record("a 4 MB answer should stream")
                return
            }
            var total = 0
            for try await chunk in stream {
                total += chunk.readableBytes
                if total >= 256 << 10 { break }
            }
            #expect(try await Self.eventually { provider.open.load(ordering: .relaxed) == 0 })
            let whole = try await Self.get(client, "/big")
            let (text, failure) = await Self.text(whole.body)
            #expect(failure == nil)
            #expect(text.utf8.count == 4 << 20)
            #expect(provider.accepted.load(ordering: .relaxed) == 2)
            // After a complete stream the connection is reused.
            try await Self.expectText(client, "/keep", "ok")
            #expect(provider.accepted.load(ordering: .relaxed) == 2)
        }
    }

    @Test("upstream.url must be an absolute http(s) URL")
    func badURL() async throws {
        let configuration = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        for url in ["ftp://example.com", "example.com/v1", "http://"] {
            #expect(throws: ConfigurationError.self) {
                _ = try UpstreamClient(configuration: configuration, baseURL: url, eventLoopGroup: MultiThreadedEventLoopGroup.singleton)
            }
        }
        let secure = try UpstreamClient(
            configuration: configuration, baseURL: "https://api.example.com/base/", eventLoopGroup: MultiThreadedEventLoopGroup.singleton)
        #expect(secure.endpoint.port == 443)
        #expect(secure.endpoint.authority == "api.example.com")
        #expect(secure.endpoint.basePath == "/base")
        #expect(secure.tls != nil)
    }
}
