import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// CapGate's HTTP/1.1 client for the provider: one request per connection at a time, idle
/// connections kept per event loop, the request head and body sent in one write, no redirects
/// followed, no decompression (bodies pass through byte for byte), no retries (an unreachable
/// provider is a fast 502, not a wait). `https` base URLs use TLS with the system's trust roots.
///
/// Why not AsyncHTTPClient: measured at 64 concurrent calls, the upstream call cost the gateway
/// ≈ 95 µs of CPU per call, half of its whole cost, spent mostly in a second write system call
/// (AsyncHTTPClient flushes the head before the body), its request state machines and a timer
/// re-armed on every read. A gateway has one upstream host and needs none of the rest.
///
/// Connections are opened as calls need them (no cap: one per call in flight, reused after) and
/// speak HTTP/1.1 only, also over TLS. An idle connection the provider has closed is dropped from
/// the pool when the close is seen; a call that races such a close fails as unreachable (502,
/// refunded), as it did with AsyncHTTPClient: a call is never sent twice.
///
/// A caller is served on the event loop it runs on (CapGate's tasks run on the NIO loops), with
/// that loop's idle connections, so nothing hops between threads.
public final class UpstreamClient: Sendable {
    /// The base URL as configured, without a trailing slash.
    public let baseURL: String
    public let apiKey: String?
    let endpoint: Endpoint
    let settings: Settings
    let group: any EventLoopGroup
    let pools: [ObjectIdentifier: NIOLoopBoundBox<ConnectionPool>]
    let tls: NIOSSLContext?

    /// Where the provider is.
    struct Endpoint: Sendable {
        var host: String
        var port: Int
        var basePath: String
        /// The `host` header.
        var authority: String
    }

    struct Settings: Sendable {
        var connectTimeout: TimeAmount
        /// Time allowed from sending the request to the response head.
        var headTimeout: TimeAmount
        /// Longest silence while the body arrives.
        var idleTimeout: TimeAmount
        /// A connection unused for this long is not used again.
        var keepIdle: TimeAmount = .seconds(60)
        /// Answers up to this size with a declared length are read whole before they are returned.
        var wholeBodyLimit: Int
        /// Idle connections kept per event loop; more are closed.
        var maxIdlePerLoop = 256
    }

    public init(configuration: CapGateConfiguration, baseURL: String, eventLoopGroup: any EventLoopGroup) throws {
        let trimmed = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        guard CapGateConfiguration.isHTTPURL(trimmed), let url = URL(string: trimmed), let host = url.host else {
            throw ConfigurationError(key: "upstream.url", problem: "is not an absolute http(s) URL")
        }
        let secure = url.scheme?.lowercased() == "https"
        let port = url.port ?? (secure ? 443 : 80)
        let hostLiteral = host.contains(":") ? "[\(host)]" : host
        let authority = url.port.map { "\(hostLiteral):\($0)" } ?? hostLiteral
        // The base path as written (percent-encoding kept), like the request's own path.
        let basePath = url.path(percentEncoded: true)
        self.endpoint = Endpoint(host: host, port: port, basePath: basePath, authority: authority)
        if secure {
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            tlsConfiguration.applicationProtocols = ["http/1.1"]
            self.tls = try NIOSSLContext(configuration: tlsConfiguration)
        } else {
            self.tls = nil
        }
        self.baseURL = trimmed
        self.apiKey = configuration.upstreamAPIKey
        self.settings = Settings(
            connectTimeout: .fromSeconds(configuration.upstreamConnectTimeout),
            headTimeout: .fromSeconds(configuration.upstreamTimeout),
            idleTimeout: .fromSeconds(configuration.upstreamIdleTimeout),
            wholeBodyLimit: Self.wholeBodyLimit
        )
        self.group = eventLoopGroup
        var pools: [ObjectIdentifier: NIOLoopBoundBox<ConnectionPool>] = [:]
        for loop in eventLoopGroup.makeIterator() {
            pools[ObjectIdentifier(loop)] = .makeBoxSendingValue(ConnectionPool(maxIdle: settings.maxIdlePerLoop), eventLoop: loop)
        }
        self.pools = pools
    }

    /// Answers up to this size with a declared length are read whole and returned as one buffer.
    public static let wholeBodyLimit = 256 << 10

    /// Sends one request. `target` is the path and query, appended to the base URL's path;
    /// `host` and `content-length` are set here. Returns once the head arrived (an answer of
    /// known length up to ``wholeBodyLimit`` is read whole first).
    func execute(method: HTTPMethod, target: String, headers: HTTPHeaders, body: ByteBuffer?) async throws -> UpstreamResponse {
        let current = MultiThreadedEventLoopGroup.currentEventLoop
        let loop = current.flatMap { pools[ObjectIdentifier($0)] == nil ? nil : $0 } ?? group.next()
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: endpoint.basePath + target, headers: headers)
        head.headers.replaceOrAdd(name: "host", value: endpoint.authority)
        if let body {
            head.headers.replaceOrAdd(name: "content-length", value: String(body.readableBytes))
        }
        // The head timeout counts from here, so it includes making a connection.
        let request = UpstreamRequest(head: head, body: body, deadline: .now() + settings.headTimeout, promise: loop.makePromise())
        if loop.inEventLoop {
            start(request, on: loop)
        } else {
            loop.execute { self.start(request, on: loop) }
        }
        return try await request.promise.futureResult.get()
    }

    /// Closes the idle connections; requests in flight finish on theirs.
    public func shutdown() async throws {
        for bound in pools.values {
            try await bound.eventLoop.submit { bound.value.shutdown() }.get()
        }
    }

    private func start(_ request: UpstreamRequest, on loop: any EventLoop) {
        guard let bound = pools[ObjectIdentifier(loop)] else {
            request.promise.fail(UpstreamError.unreachable("no connection pool for this event loop"))
            return
        }
        let pool = bound.value
        if pool.isShutdown {
            request.promise.fail(UpstreamError.unreachable("the gateway is shutting down"))
            return
        }
        if let connection = pool.takeIdle(keepIdle: settings.keepIdle) {
            connection.send(request)
            return
        }
        let settings = self.settings
        let tls = self.tls
        let host = endpoint.host
        let poolBound = bound
        ClientBootstrap(group: loop)
            .connectTimeout(settings.connectTimeout)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let tls {
                        // SNI carries names only, never an address.
                        let isAddress = (try? SocketAddress(ipAddress: host, port: 0)) != nil
                        try sync.addHandler(NIOSSLClientHandler(context: tls, serverHostname: isAddress ? nil : host))
                    }
                    try sync.addHTTPClientHandlers()
                    try sync.addHandler(UpstreamConnection(pool: poolBound.value, settings: settings))
                }
            }
            .connect(host: host, port: endpoint.port)
            .assumeIsolated()
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    do {
                        try channel.pipeline.syncOperations.handler(type: UpstreamConnection.self).send(request)
                    } catch {
                        request.promise.fail(UpstreamError.unreachable(String(describing: error)))
                        channel.close(promise: nil)
                    }
                case .failure(let error):
                    if case ChannelError.connectTimeout = error {
                        request.promise.fail(UpstreamError.connectTimeout)
                    } else {
                        request.promise.fail(UpstreamError.unreachable(String(describing: error)))
                    }
                }
            }
    }
}

/// Why a call to the provider failed.
enum UpstreamError: Error, Sendable, Equatable, CustomStringConvertible {
    /// No connection within `upstream.connectTimeout`.
    case connectTimeout
    /// No response head within `upstream.timeout`.
    case headTimeout
    /// The body went silent for longer than `upstream.idleTimeout`.
    case idleTimeout
    /// The connection could not be made.
    case unreachable(String)
    /// The provider closed the connection before the answer was complete.
    case closed

    var isTimeout: Bool {
        switch self {
        case .connectTimeout, .headTimeout, .idleTimeout: true
        case .unreachable, .closed: false
        }
    }

    var description: String {
        switch self {
        case .connectTimeout: "no connection to the provider in time"
        case .headTimeout: "the provider did not answer in time"
        case .idleTimeout: "the provider's answer stalled"
        case .unreachable(let reason): "the provider could not be reached: \(reason)"
        case .closed: "the provider closed the connection before the answer was complete"
        }
    }
}

/// The provider's answer.
struct UpstreamResponse: Sendable {
    var head: HTTPResponseHead
    var body: UpstreamBody
}

/// The body of the provider's answer: whole (with why it ended early, if it did), or a stream
/// read from the connection as the consumer asks for it.
enum UpstreamBody: Sendable {
    case whole(ByteBuffer, failure: UpstreamError?)
    case stream(UpstreamStream)
}

typealias UpstreamStream = NIOThrowingAsyncSequenceProducer<
    ByteBuffer, any Error, NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark, UpstreamStreamDelegate
>

struct UpstreamRequest: Sendable {
    var head: HTTPRequestHead
    var body: ByteBuffer?
    /// When the response head must have arrived.
    var deadline: NIODeadline
    var promise: EventLoopPromise<UpstreamResponse>
}

/// One event loop's idle connections, most recently used first. Used only on its loop.
final class ConnectionPool {
    private var idle: [UpstreamConnection] = []
    private let maxIdle: Int
    private(set) var isShutdown = false

    init(maxIdle: Int) {
        self.maxIdle = maxIdle
    }

    /// The most recently used idle connection, closing those unused for longer than `keepIdle`.
    func takeIdle(keepIdle: TimeAmount) -> UpstreamConnection? {
        let oldest = NIODeadline.now() - keepIdle
        while let connection = idle.popLast() {
            if connection.idleSince > oldest { return connection }
            connection.close()
        }
        return nil
    }

    func release(_ connection: UpstreamConnection) {
        guard !isShutdown, idle.count < maxIdle else {
            connection.close()
            return
        }
        idle.append(connection)
    }

    func remove(_ connection: UpstreamConnection) {
        if let index = idle.lastIndex(where: { $0 === connection }) { idle.remove(at: index) }
    }

    func shutdown() {
        isShutdown = true
        let connections = idle
        idle.removeAll()
        for connection in connections { connection.close() }
    }
}

/// Asks the connection for more of the body, or tells it the consumer is gone.
struct UpstreamStreamDelegate: NIOAsyncSequenceProducerDelegate {
    let connection: NIOLoopBound<UpstreamConnection>
    let exchange: Int

    func produceMore() {
        let connection = self.connection
        let exchange = self.exchange
        connection.eventLoop.execute { connection.value.consumerWantsMore(exchange: exchange) }
    }

    func didTerminate() {
        let connection = self.connection
        let exchange = self.exchange
        connection.eventLoop.execute { connection.value.consumerFinished(exchange: exchange) }
    }
}

/// The last handler of an upstream connection: sends a request, gathers or streams its answer,
/// enforces the head and idle timeouts, and gives the connection back to its pool when the
/// answer ended and both sides keep the connection alive.
final class UpstreamConnection: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    private enum State {
        case idle
        case waitingForHead(UpstreamRequest)
        case gathering(UpstreamRequest, HTTPResponseHead, ByteBuffer)
        case streaming(UpstreamStream.Source)
        case closed
    }

    private let pool: ConnectionPool
    private let settings: UpstreamClient.Settings
    private var state = State.idle
    private var context: ChannelHandlerContext?
    private var timer: Scheduled<Void>?
    private var lastRead = NIODeadline.now()
    private var keepAlive = true
    /// The whole request has been handed to the kernel. A provider may answer early (a 413 or
    /// 429 before reading the body): such a connection is closed, not reused, while it still
    /// has request bytes to send.
    private var requestSent = false
    /// Counts requests on this connection; a stream's delegate names the one it belongs to.
    private var exchange = 0
    /// The consumer of a stream has enough buffered: reads wait.
    private var readPaused = false
    private var readPending = false
    fileprivate(set) var idleSince = NIODeadline.now()

    init(pool: ConnectionPool, settings: UpstreamClient.Settings) {
        self.pool = pool
        self.settings = settings
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func send(_ request: UpstreamRequest) {
        guard let context, case .idle = state, context.channel.isActive else {
            request.promise.fail(UpstreamError.closed)
            return
        }
        exchange += 1
        keepAlive = true
        requestSent = false
        state = .waitingForHead(request)
        context.write(wrapOutboundOut(.head(request.head)), promise: nil)
        if let body = request.body, body.readableBytes > 0 {
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        let sent = context.eventLoop.makePromise(of: Void.self)
        let current = exchange
        sent.futureResult.assumeIsolated().whenSuccess { [self] in
            if exchange == current { requestSent = true }
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: sent)
        arm(at: request.deadline)
    }

    func close() {
        if case .streaming(let source) = state { source.finish(UpstreamError.closed) }
        state = .closed
        context?.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            guard case .waitingForHead(let request) = state else { return }
            // An informational answer (100 Continue and the like) is not the answer.
            if head.status.code < 200 && head.status != .switchingProtocols { return }
            keepAlive = head.isKeepAlive
            lastRead = .now()
            arm(at: lastRead + settings.idleTimeout)
            let length = head.headers.first(name: "content-length").flatMap(Int.init)
            let eventStream = head.headers.first(name: "content-type")?.lowercased().hasPrefix("text/event-stream") ?? false
            if request.head.method != .HEAD, let length, length <= settings.wholeBodyLimit, !eventStream {
                state = .gathering(request, head, context.channel.allocator.buffer(capacity: length))
            } else {
                let delegate = UpstreamStreamDelegate(connection: NIOLoopBound(self, eventLoop: context.eventLoop), exchange: exchange)
                let stream = UpstreamStream.makeSequence(
                    backPressureStrategy: .init(lowWatermark: 2, highWatermark: 8), finishOnDeinit: false, delegate: delegate)
                state = .streaming(stream.source)
                request.promise.succeed(UpstreamResponse(head: head, body: .stream(stream.sequence)))
            }
        case .body(let chunk):
            lastRead = .now()
            switch state {
            case .gathering(let request, let head, var whole):
                state = .closed  // keeps `whole` uniquely referenced while it grows
                whole.writeImmutableBuffer(chunk)
                state = .gathering(request, head, whole)
            case .streaming(let source):
                if source.yield(chunk) == .stopProducing { readPaused = true }
            case .idle, .waitingForHead, .closed:
                break
            }
        case .end:
            switch state {
            case .gathering(let request, let head, let whole):
                request.promise.succeed(UpstreamResponse(head: head, body: .whole(whole, failure: nil)))
            case .streaming(let source):
                source.finish()
            case .idle, .waitingForHead, .closed:
                return
            }
            answerEnded(context: context)
        }
    }

    /// The answer is complete: the connection goes back to its pool, or is closed.
    private func answerEnded(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        guard keepAlive, requestSent, context.channel.isActive else {
            close()
            return
        }
        state = .idle
        readPaused = false
        idleSince = .now()
        if readPending {
            readPending = false
            context.read()
        }
        pool.release(self)
    }

    func read(context: ChannelHandlerContext) {
        if readPaused {
            readPending = true
        } else {
            context.read()
        }
    }

    func consumerWantsMore(exchange: Int) {
        guard exchange == self.exchange, case .streaming = state else { return }
        readPaused = false
        lastRead = .now()
        if readPending, let context {
            readPending = false
            context.read()
        }
    }

    /// The stream's consumer stopped (it finished, or gave up): an answer still arriving cannot
    /// be followed by another request on this connection.
    func consumerFinished(exchange: Int) {
        guard exchange == self.exchange, case .streaming = state else { return }
        timer?.cancel()
        timer = nil
        close()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        fail(.closed)
        pool.remove(self)
        context.fireChannelInactive()
    }

    private func fail(_ error: UpstreamError) {
        let previous = state
        state = .closed
        switch previous {
        case .waitingForHead(let request):
            request.promise.fail(error)
        case .gathering(let request, let head, let whole):
            // What arrived is passed on; the caller sees why it ended early.
            request.promise.succeed(UpstreamResponse(head: head, body: .whole(whole, failure: error)))
        case .streaming(let source):
            source.finish(error)
        case .idle, .closed:
            break
        }
    }

    private func arm(at deadline: NIODeadline) {
        timer?.cancel()
        guard let context else { return }
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in
            timerFired()
        }
    }

    private func timerFired() {
        timer = nil
        switch state {
        case .waitingForHead:
            fail(.headTimeout)
            context?.close(promise: nil)
        case .gathering, .streaming:
            // A consumer that is slow to take the body is not a silent provider.
            let now = NIODeadline.now()
            if readPaused {
                arm(at: now + settings.idleTimeout)
            } else if now - lastRead >= settings.idleTimeout {
                fail(.idleTimeout)
                context?.close(promise: nil)
            } else {
                arm(at: lastRead + settings.idleTimeout)
            }
        case .idle, .closed:
            break
        }
    }
}

extension TimeAmount {
    /// Seconds given as a configuration `Double`.
    static func fromSeconds(_ value: Double) -> TimeAmount {
        .nanoseconds(Int64((value * 1_000_000_000).rounded()))
    }
}
