import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import CapGate

/// The upstream connection's state machine on `NIOEmbedded`: the HTTP parts the provider sends
/// are fed in, the parts the connection writes are read out; no socket.
@Suite("Upstream connection (embedded)", .timeLimit(.minutes(1)))
struct UpstreamConnectionTests {
    /// A connected embedded channel running one ``UpstreamConnection``.
    struct Rig {
        let channel: EmbeddedChannel
        let connection: UpstreamConnection
        let pool: ConnectionPool

        init(wholeBodyLimit: Int = 1024) throws {
            let settings = UpstreamClient.Settings(
                connectTimeout: .seconds(5), headTimeout: .seconds(5), idleTimeout: .seconds(5), wholeBodyLimit: wholeBodyLimit)
            pool = ConnectionPool(maxIdle: 4, limiter: ConnectionLimiter(maxConnections: 4))
            connection = UpstreamConnection(pool: pool, settings: settings)
            channel = EmbeddedChannel(handler: connection)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()
        }

        /// Sends a request; returns the future of its answer.
        func send(_ method: HTTPMethod = .POST, body: String? = "{}") -> EventLoopFuture<UpstreamResponse> {
            let promise = channel.eventLoop.makePromise(of: UpstreamResponse.self)
            connection.send(
                UpstreamRequest(
                    head: HTTPRequestHead(version: .http1_1, method: method, uri: "/v1/messages"),
                    body: body.map { ByteBuffer(string: $0) },
                    deadline: .now() + .seconds(5), promise: promise))
            return promise.futureResult
        }

        /// The request parts written: head, body bytes and end.
        func written() throws -> (HTTPRequestHead?, String, Bool) {
            var head: HTTPRequestHead?
            var body = ""
            var ended = false
            while let part = try channel.readOutbound(as: HTTPClientRequestPart.self) {
                switch part {
                case .head(let h): head = h
                case .body(.byteBuffer(let b)): body += String(buffer: b)
                case .body: break
                case .end: ended = true
                }
            }
            return (head, body, ended)
        }

        func answer(_ status: HTTPResponseStatus = .ok, headers: [(String, String)] = [], body: String? = nil, end: Bool = true) throws {
            try channel.writeInbound(
                HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: status, headers: HTTPHeaders(headers))))
            if let body { try channel.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: body))) }
            if end { try channel.writeInbound(HTTPClientResponsePart.end(nil)) }
        }
    }

    @Test("a request goes out whole; a small answer of known length comes back whole and the connection is kept")
    func wholeAnswer() throws {
        let rig = try Rig()
        let future = rig.send()
        let (head, body, ended) = try rig.written()
        #expect(head?.method == .POST && head?.uri == "/v1/messages" && body == "{}" && ended)
        try rig.answer(headers: [("content-length", "5")], body: "hello")
        let response = try future.wait()
        guard case .whole(let whole, let failure) = response.body else {
            Issue.record("not gathered whole")
            return
        }
        #expect(String(buffer: whole) == "hello" && failure == nil)
        #expect(rig.connection.isIdle && rig.channel.isActive)
        #expect(rig.pool.takeIdle(keepIdle: .seconds(60)) === rig.connection)
    }

    @Test("an answer with no length, or larger than the whole-body limit, or an event stream, is streamed")
    func streamed() throws {
        for headers in [[("transfer-encoding", "chunked")], [("content-length", "4096")], [("content-type", "text/event-stream")]] {
            let rig = try Rig()
            let future = rig.send()
            _ = try rig.written()
            try rig.answer(headers: headers, end: false)
            guard case .stream = try future.wait().body else {
                Issue.record("\(headers) was not streamed")
                continue
            }
        }
    }

    @Test("an answer nobody asked for closes the connection: it is out of step with its provider")
    func outOfTurn() throws {
        let rig = try Rig()
        let future = rig.send(body: nil)
        _ = try rig.written()
        try rig.answer(headers: [("content-length", "2")], body: "ok")
        _ = try future.wait()
        #expect(rig.channel.isActive)
        try rig.answer(headers: [("content-length", "5")], body: "extra")
        #expect(!rig.channel.isActive)
    }

    @Test("100 Continue is not the answer; `Connection: close` is not kept")
    func informationalAndClose() throws {
        let rig = try Rig()
        let future = rig.send()
        _ = try rig.written()
        try rig.channel.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .continue)))
        try rig.answer(headers: [("content-length", "2"), ("connection", "close")], body: "ok")
        #expect(try future.wait().head.status == .ok)
        #expect(!rig.channel.isActive)
        #expect(rig.pool.takeIdle(keepIdle: .seconds(60)) == nil)
    }

    @Test("a connection that closes mid-answer passes on what came, with why it ended; before the head it fails the call")
    func closedEarly() throws {
        let rig = try Rig()
        let future = rig.send()
        _ = try rig.written()
        try rig.answer(headers: [("content-length", "10")], body: "hal", end: false)
        rig.channel.pipeline.fireChannelInactive()
        guard case .whole(let part, let failure) = try future.wait().body else {
            Issue.record("not gathered")
            return
        }
        #expect(String(buffer: part) == "hal" && failure == .closed)

        let second = try Rig()
        let failed = second.send()
        _ = try second.written()
        second.channel.pipeline.fireChannelInactive()
        #expect(throws: UpstreamError.closed) { try failed.wait() }
    }

    @Test("a request sent on a closed connection is handed back unsent (a pooled connection), never written")
    func unsentOnClosed() throws {
        let rig = try Rig()
        rig.connection.close()
        let promise = rig.channel.eventLoop.makePromise(of: UpstreamResponse.self)
        var handedBack = false
        rig.connection.send(
            UpstreamRequest(
                head: HTTPRequestHead(version: .http1_1, method: .GET, uri: "/"), body: nil, deadline: .now() + .seconds(1),
                promise: promise)
        ) { _ in handedBack = true }
        #expect(handedBack)
        #expect(try rig.written().0 == nil)
        promise.fail(UpstreamError.closed)
    }
}
