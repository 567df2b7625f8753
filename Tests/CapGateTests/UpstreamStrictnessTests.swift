import CapGate
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import CapGate

/// The upstream client is as strict as AsyncHTTPClient: framing per method, a connection that
/// speaks out of turn is dropped, a request is sent again only when none of its bytes left,
/// a cap on connections; and the proxy strips hop-by-hop fields both ways.
@Suite("Upstream strictness", .serialized, .timeLimit(.minutes(2)))
struct UpstreamStrictnessTests {
    // MARK: helpers

    /// A gateway forwarding to a recording provider, with one unlimited company and user.
    static func withGateway(
        settings: [String: String] = [:], _ body: @Sendable (Harness, RecordingProvider, String) async throws -> Void
    ) async throws {
        let provider = try await RecordingProvider.start()
        defer { provider.stop() }
        try await Harness.with(upstreamURL: provider.url, settings: settings) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (_, users) = try await h.createCompany(plan: "open", users: 1)
            try await body(h, provider, users[0].key)
        }
    }

    /// A client on a one-thread loop group against a recording provider.
    static func withClient(
        settings: [String: String] = [:], _ body: (UpstreamClient, RecordingProvider, any EventLoopGroup) async throws -> Void
    ) async throws {
        let provider = try await RecordingProvider.start()
        defer { provider.stop() }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let configuration = try await CapGateConfiguration.load(flags: settings, environment: [:], file: "/nonexistent.json")
        let client = try UpstreamClient(configuration: configuration, baseURL: provider.url, eventLoopGroup: group)
        var failure: (any Error)?
        do { try await body(client, provider, group) } catch { failure = error }
        try await client.shutdown()
        try await group.shutdownGracefully()
        if let failure { throw failure }
    }

    static func call(_ client: UpstreamClient, _ path: String, method: HTTPMethod = .GET, body: String? = nil) async throws -> String {
        let response = try await client.execute(
            method: method, target: path, headers: HTTPHeaders(), body: body.map { ByteBuffer(string: $0) })
        let (text, failure) = await UpstreamClientTests.text(response.body)
        if let failure { throw failure }
        return text
    }

    struct RawReply {
        var status: Int
        var headers: [String: String]
        var body: String
    }

    /// Sends `text` as it is to the gateway (which must close after answering) and reads the answer.
    static func raw(_ h: Harness, _ text: String) async throws -> RawReply {
        let port = Int(h.gatewayURL.split(separator: ":").last!)!
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let received = try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: text))
            // Until the answer is complete (by its content-length) or the gateway closes.
            var all = ByteBuffer()
            for try await var chunk in inbound {
                all.writeBuffer(&chunk)
                let text = String(buffer: all)
                guard let end = text.range(of: "\r\n\r\n") else { continue }
                let head = text[..<end.lowerBound].lowercased()
                let length = head.components(separatedBy: "\r\n").first { $0.hasPrefix("content-length:") }
                    .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) }
                if let length, text.utf8.count - text[..<end.upperBound].utf8.count >= length { break }
            }
            return String(buffer: all)
        }
        let parts = received.components(separatedBy: "\r\n\r\n")
        var lines = parts[0].components(separatedBy: "\r\n")
        let status = Int(lines.removeFirst().split(separator: " ")[1]) ?? 0
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return RawReply(status: status, headers: headers, body: parts.dropFirst().joined(separator: "\r\n\r\n"))
    }

    // MARK: 1. framing per method

    @Test("TRACE with a request smuggled in its body: refused, nothing reaches the provider, nothing charged")
    func traceSmuggling() async throws {
        try await Self.withGateway { h, provider, key in
            let smuggled = "GET /v1/smuggled HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
            let reply = try await Self.raw(
                h,
                "TRACE /v1/x HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\ncontent-length: \(smuggled.utf8.count)\r\n"
                    + "connection: close\r\n\r\n" + smuggled)
            // Refused from the head (SPEC §2: TRACE is 405 on any path): nothing charged, nothing sent.
            #expect(reply.status == 405, "\(reply.status) \(reply.body)")
            #expect(reply.body.contains("\"type\":\"error\""))
            // Let anything that was sent arrive.
            try await Task.sleep(for: .milliseconds(200))
            #expect(provider.requestLines.isEmpty, "\(provider.requestLines)")
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 0)
            // The same gateway still forwards ordinary calls, one request each.
            let get = try await h.request(.GET, "/v1/models", headers: [("x-api-key", key)])
            #expect(get.status == 200)
            #expect(provider.requestLines == ["GET /v1/models"])
        }
    }

    @Test("a body on GET, DELETE or OPTIONS is framed by content-length; every request with a body has one")
    func bodiesAreFramed() async throws {
        try await Self.withGateway { h, provider, key in
            for method in ["GET", "DELETE", "OPTIONS", "POST"] {
                let body = "GET /v1/smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
                let reply = try await Self.raw(
                    h,
                    "\(method) /v1/framed HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\ncontent-length: \(body.utf8.count)\r\n"
                        + "connection: close\r\n\r\n" + body)
                #expect(reply.status == 200, "\(method): \(reply.status) \(reply.body)")
            }
            // An empty POST says so with content-length: 0; an empty GET carries no framing at all.
            #expect(try await h.request(.POST, "/v1/empty", headers: [("x-api-key", key)]).status == 200)
            #expect(try await h.request(.GET, "/v1/empty", headers: [("x-api-key", key)]).status == 200)
            try await Task.sleep(for: .milliseconds(100))
            let requests = provider.requests
            #expect(
                requests.map(\.line) == [
                    "GET /v1/framed", "DELETE /v1/framed", "OPTIONS /v1/framed", "POST /v1/framed", "POST /v1/empty", "GET /v1/empty",
                ])
            for request in requests.prefix(4) {
                #expect(request.headers["content-length"] == "38" && request.body.hasPrefix("GET /v1/smuggled"), "\(request.line)")
                #expect(request.headers["transfer-encoding"] == nil)
            }
            #expect(requests.count == 6 && requests[4].headers["content-length"] == "0")
            #expect(requests.count == 6 && requests[5].headers["content-length"] == nil)
        }
    }

    @Test("the client refuses TRACE with a body and CONNECT without sending anything")
    func clientRefusesUnframable() async throws {
        try await Self.withClient { client, provider, _ in
            await #expect(throws: UpstreamError.notFramable("a TRACE request cannot carry a body")) {
                _ = try await Self.call(client, "/t", method: .TRACE, body: "GET /smuggled HTTP/1.1\r\n\r\n")
            }
            await #expect(throws: UpstreamError.self) { _ = try await Self.call(client, "/t", method: .CONNECT) }
            // TRACE without a body is an ordinary call.
            _ = try await Self.call(client, "/t", method: .TRACE)
            #expect(provider.requestLines == ["TRACE /t"])
        }
    }

    // MARK: 2. a connection that speaks while idle

    @Test("a pooled connection that receives bytes while idle is closed, never reused")
    func idleBytes() async throws {
        try await Self.withClient { client, provider, _ in
            _ = try await Self.call(client, "/idle-bytes")
            // The unasked-for answer arrives 100 ms after the first one.
            #expect(try await UpstreamClientTests.eventually { provider.open.load(ordering: .relaxed) == 0 })
            let next = try await Self.call(client, "/after")
            #expect(next.contains("msg_rec") && !next.contains("stale"))
            #expect(provider.accepted.load(ordering: .relaxed) == 2)
            #expect(provider.requestLines == ["GET /idle-bytes", "GET /after"])
        }
    }

    // MARK: 3. sent again only when nothing left

    @Test("a request that could not be written on a pooled connection reset while idle is sent once on a new one")
    func staleRetried() async throws {
        try await Self.withClient { client, provider, group in
            _ = try await Self.call(client, "/first")
            #expect(provider.accepted.load(ordering: .relaxed) == 1)
            // Keep the client's loop busy while the provider resets the idle connection, so the
            // next call takes it from the pool before the loop has seen the reset.
            let loop = group.next()
            let started = loop.submit { Thread.sleep(forTimeInterval: 0.6) }
            try await Task.sleep(for: .milliseconds(100))
            try await provider.resetConnections()
            try await Task.sleep(for: .milliseconds(100))
            async let second = Self.call(client, "/second")
            try await started.get()
            let text = try await second
            #expect(text.contains("msg_rec"))
            #expect(provider.accepted.load(ordering: .relaxed) == 2)
            #expect(provider.requestLines == ["GET /first", "GET /second"])
        }
    }

    @Test("a request whose bytes left is never sent again, even when the connection then closes")
    func sentNotRetried() async throws {
        try await Self.withClient { client, provider, _ in
            _ = try await Self.call(client, "/first")
            await #expect(throws: UpstreamError.closed) { _ = try await Self.call(client, "/close-on-read", method: .POST, body: "{}") }
            try await Task.sleep(for: .milliseconds(200))
            #expect(provider.requestLines == ["GET /first", "POST /close-on-read"])
            #expect(provider.accepted.load(ordering: .relaxed) == 1)
        }
    }

    // MARK: 4. the connection cap

    @Test("upstream.maxConnections 2: ten slow calls at once all succeed over at most two connections")
    func connectionCap() async throws {
        try await Self.withGateway(settings: ["upstream.maxConnections": "2"]) { h, provider, key in
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<10 {
                    group.addTask { try await h.request(.GET, "/v1/slow", headers: [("x-api-key", key)]).status }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(statuses == Array(repeating: 200, count: 10))
            #expect(provider.maxOpen.load(ordering: .relaxed) <= 2)
            #expect(provider.maxInFlight.load(ordering: .relaxed) <= 2)
            #expect(provider.requestLines.count == 10)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 10)
        }
    }

    @Test("a call that finds every connection busy past upstream.timeout fails as a timeout")
    func queueTimeout() async throws {
        try await Self.withClient(settings: ["upstream.maxConnections": "1", "upstream.timeout": "0.3"]) { client, provider, _ in
            // A body that stalls holds the only connection.
            let held = try await client.execute(method: .GET, target: "/stall", headers: HTTPHeaders(), body: nil)
            await #expect(throws: UpstreamError.queueTimeout) { _ = try await Self.call(client, "/queued") }
            #expect(provider.requestLines == ["GET /stall"])
            #expect(client.limiter.openConnections == 1)
            // Once it is given up, its place is free again.
            _ = held
            guard case .stream(let stream) = held.body else { throw UpstreamError.closed }
            for try await _ in stream { break }
            _ = try await Self.call(client, "/after")
            #expect(provider.requestLines == ["GET /stall", "GET /after"])
        }
    }

    // MARK: 5. hop-by-hop fields and the provider's organisation

    @Test("fields a Connection header names are stripped both ways; anthropic-organization-* is not passed back")
    func connectionNamedFields() async throws {
        try await Self.withGateway { h, provider, key in
            let reply = try await Self.raw(
                h,
                "GET /v1/headers HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\nconnection: close, x-secret-thing\r\n"
                    + "x-secret-thing: from-client\r\nx-kept: client-field\r\n\r\n")
            #expect(reply.status == 200, "\(reply.body)")
            let sent = try #require(provider.requests.last)
            #expect(sent.headers["x-secret-thing"] == nil)
            #expect(sent.headers["x-kept"] == "client-field")
            #expect(sent.headers["connection"] == nil || sent.headers["connection"]?.contains("secret") == false)
            #expect(reply.headers["x-secret-thing"] == nil)
            #expect(reply.headers["x-kept"] == "end-to-end")
            #expect(reply.headers["anthropic-organization-id"] == nil)
            #expect(reply.headers["anthropic-organization-name"] == nil)
            #expect(!reply.headers.values.contains { $0.contains("org-secret") })
        }
        #expect(
            ForwardedFields.connectionOptions(["close, X-Secret-Thing", " keep-alive ,,\tfoo"]) == [
                "close", "x-secret-thing", "keep-alive", "foo",
            ])
    }

    // MARK: 6. the ledger's model

    @Test("a body that repeats model is refused 400 before admission: nothing charged, nothing forwarded")
    func repeatedModel() async throws {
        let provider = try await RecordingProvider.start()
        defer { provider.stop() }
        try await Harness.with(upstreamURL: provider.url) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (_, users) = try await h.createCompany(plan: "open", users: 1)
            let body =
                #"{"model":"claude-first","max_tokens":16,"messages":[{"role":"user","content":"{\"model\":\"inner\"}"}],"model":"claude-last"}"#
            let reply = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", users[0].key), ("content-type", "application/json")], body: body)
            #expect(reply.status == 400)
            #expect(reply.body.contains("invalid_request_error") && reply.body.contains("appears twice"))
            #expect(try await h.text("SELECT count(*) FROM usage_ledger") == "0")
            #expect(provider.requests.isEmpty)
            // The nested "model" inside a string is content, not a member: one model, recorded.
            let single = #"{"model":"claude-x","max_tokens":16,"messages":[{"role":"user","content":"{\"model\":\"inner\"}"}]}"#
            let served = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", users[0].key), ("content-type", "application/json")], body: single)
            #expect(served.status == 200)
            #expect(try await h.text("SELECT model FROM usage_ledger") == "claude-x")
        }
    }

    // MARK: 7. bodies in pieces

    @Test(
        "a body in many pieces, with a Content-Length or chunked without one, reaches the provider byte for byte, framed by content-length")
    func bodiesInPieces() async throws {
        try await Self.withGateway(settings: ["http.bodyTimeout": "2"]) { h, provider, key in
            let port = Int(h.gatewayURL.split(separator: ":").last!)!
            let body = OverloadTests.body(size: 150_000)
            let bytes = Array(body.utf8)
            let pieces = stride(from: 0, to: bytes.count, by: 40_000).map {
                String(decoding: bytes[$0..<min($0 + 40_000, bytes.count)], as: UTF8.self)
            }
            let declared = try await RawConnection.open(port: port)
            defer { declared.close() }
            try await declared.send(OverloadTests.head(key: key, length: bytes.count))
            for piece in pieces {
                try await declared.send(piece)
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(try #require(await declared.answer(within: .seconds(10))).status == 200)

            let chunked = try await RawConnection.open(port: port)
            defer { chunked.close() }
            try await chunked.send(OverloadTests.head(key: key, chunked: true))
            for piece in pieces {
                try await chunked.send(String(piece.utf8.count, radix: 16) + "\r\n" + piece + "\r\n")
                try await Task.sleep(for: .milliseconds(20))
            }
            try await chunked.send("0\r\n\r\n")
            #expect(try #require(await chunked.answer(within: .seconds(10))).status == 200)
            let requests = provider.requests
            #expect(requests.count == 2)
            for request in requests {
                #expect(request.body == body && request.headers["content-length"] == String(bytes.count))
                #expect(request.headers["transfer-encoding"] == nil)
            }

            // A Content-Length shorter than what is sent: the body ends at it and what follows is
            // a request of its own (here one without a credential, 401, never forwarded); one
            // longer than what arrives: 408 at http.bodyTimeout, nothing forwarded.
            let short = try await RawConnection.open(port: port)
            defer { short.close() }
            try await short.send(OverloadTests.head(key: key, length: bytes.count) + body + "GET /v1/smuggled HTTP/1.1\r\nhost: x\r\n\r\n")
            #expect(try #require(await short.answer(within: .seconds(10))).status == 200)
            #expect(try #require(await short.answer(within: .seconds(10))).status == 401)
            let long = try await RawConnection.open(port: port)
            defer { long.close() }
            try await long.send(OverloadTests.head(key: key, length: bytes.count + 1000) + body)
            #expect(try #require(await long.answer(within: .seconds(10))).status == 408)
            try await Task.sleep(for: .milliseconds(200))
            #expect(provider.requests.count == 3 && provider.requests.last?.body == body)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 3)
        }
    }
}
