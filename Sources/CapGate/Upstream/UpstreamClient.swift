import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// CapGate's HTTP/1.1 client for the provider: one request per connection at a time, idle
/// connections kept per event loop, the request head and body sent in one write, no redirects
/// followed, no decompression (bodies pass through byte for byte), no retries of a request that
/// may have reached the provider (an unreachable provider is a fast 502, not a wait). `https`
/// base URLs use TLS (HTTP/1.1 by ALPN, SNI with the URL's host name, the certificate checked
/// against the system's trust roots or those of `upstream.caFile`); a certificate that fails the
/// check is a 502 whose log line says why (``UpstreamTLSDiagnosis``).
///
/// As strict as AsyncHTTPClient: every request with a body is framed by `content-length` (TRACE
/// with a body and CONNECT are refused, since NIO would not frame them and their bytes could be
/// read as a second request); a pooled connection that sends anything while idle is closed, never
/// reused; a request whose first write on a pooled connection failed at once (the provider had
/// reset it while idle), so that none of its bytes left, is sent once more on a new connection;
/// at most `upstream.maxConnections` connections are open, further calls wait for one within
/// `upstream.timeout`.
///
/// Why not AsyncHTTPClient: measured at 64 concurrent calls, the upstream call cost the gateway
/// ≈ 95 µs of CPU per call, half of its whole cost, spent mostly in a second write system call
/// (AsyncHTTPClient flushes the head before the body), its request state machines and a timer
/// re-armed on every read. A gateway has one upstream host and needs none of the rest.
///
/// Connections are opened as calls need them (one per call in flight up to the cap, reused
/// after) and speak HTTP/1.1 only, also over TLS. An idle connection the provider has closed is
/// dropped from the pool when the close is seen; a call that races such a close is sent again
/// only if none of its bytes left, otherwise it fails as unreachable (502, refunded), as with
/// AsyncHTTPClient: a call is never sent twice.
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
    /// Where the trust roots come from, for the log line of a refused certificate.
    let trustSource: String
    /// The cap on connections, over every loop.
    let limiter: ConnectionLimiter

    /// How long a call may wait for the provider's answer to start (`upstream.timeout`); also the
    /// longest wait for its company's share of the connections.
    var waitLimit: Duration { .nanoseconds(settings.headTimeout.nanoseconds) }

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
        /// Connections open at once, over every loop (`upstream.maxConnections`).
        var maxConnections = 512
    }

    /// A client for the provider at `baseURL`, trusting the roots of `upstream.caFile` (or the
    /// system's).
    public convenience init(configuration: CapGateConfiguration, baseURL: String, eventLoopGroup: any EventLoopGroup) throws {
        try self.init(
            configuration: configuration, baseURL: baseURL, eventLoopGroup: eventLoopGroup,
            trust: UpstreamTrust(file: configuration.upstream.caFile, key: "upstream.caFile"))
    }

    /// A client for `baseURL` trusting `trust`'s roots (the webhook clients pass those of
    /// `notifications.caFile`).
    init(configuration: CapGateConfiguration, baseURL: String, eventLoopGroup: any EventLoopGroup, trust: UpstreamTrust) throws {
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
            tlsConfiguration.trustRoots = trust.roots
            self.tls = try NIOSSLContext(configuration: tlsConfiguration)
        } else {
            self.tls = nil
        }
        self.trustSource = trust.source
        self.baseURL = trimmed
        self.apiKey = configuration.upstream.apiKey
        self.settings = Settings(
            connectTimeout: .fromSeconds(configuration.upstream.connectTimeout),
            headTimeout: .fromSeconds(configuration.upstream.timeout),
            idleTimeout: .fromSeconds(configuration.upstream.idleTimeout),
            wholeBodyLimit: Self.wholeBodyLimit,
            maxConnections: configuration.upstream.maxConnections
        )
        self.group = eventLoopGroup
        let limiter = ConnectionLimiter(maxConnections: settings.maxConnections)
        self.limiter = limiter
        var pools: [ObjectIdentifier: NIOLoopBoundBox<ConnectionPool>] = [:]
        for loop in eventLoopGroup.makeIterator() {
            pools[ObjectIdentifier(loop)] = .makeBoxSendingValue(
                ConnectionPool(maxIdle: settings.maxIdlePerLoop, limiter: limiter), eventLoop: loop)
        }
        self.pools = pools
    }

    /// Answers up to this size with a declared length are read whole and returned as one buffer.
    public static let wholeBodyLimit = 256 << 10

    /// Sends one request. `target` is the path and query, appended to the base URL's path;
    /// `host` and the framing (`content-length`, see ``frame(_:method:bodyLength:)``) are set
    /// here. Returns once the head arrived (an answer of known length up to ``wholeBodyLimit`` is
    /// read whole first). Throws ``UpstreamError/notFramable(_:)`` at once, sending nothing, for a
    /// request that cannot be framed.
    func execute(method: HTTPMethod, target: String, headers: HTTPHeaders, body: ByteBuffer?) async throws -> UpstreamResponse {
        let current = MultiThreadedEventLoopGroup.currentEventLoop
        let loop = current.flatMap { pools[ObjectIdentifier($0)] == nil ? nil : $0 } ?? group.next()
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: endpoint.basePath + target, headers: headers)
        head.headers.replaceOrAdd(name: "host", value: endpoint.authority)
        let length = body?.readableBytes ?? 0
        try Self.frame(&head.headers, method: method, bodyLength: length)
        let body = length > 0 ? body : nil
        // The head timeout counts from here, so it includes making a connection.
        let request = UpstreamRequest(head: head, body: body, deadline: .now() + settings.headTimeout, promise: loop.makePromise())
        if loop.inEventLoop {
            start(request, on: loop)
        } else {
            loop.execute { self.start(request, on: loop) }
        }
        return try await request.promise.futureResult.get()
    }

    /// Sets the framing of a request the way AsyncHTTPClient does (`RequestValidation`): any
    /// `content-length` or `transfer-encoding` given is replaced; a body is always framed by
    /// `content-length`; an empty one gets `content-length: 0` unless the method does not expect
    /// a body (GET, HEAD, DELETE, TRACE, CONNECT). TRACE with a body is refused (NIO's encoder
    /// drops its framing, so the body would reach the provider as the next request), and so is
    /// CONNECT (its answer turns the connection into a tunnel).
    static func frame(_ headers: inout HTTPHeaders, method: HTTPMethod, bodyLength: Int) throws(UpstreamError) {
        if method == .CONNECT { throw .notFramable("CONNECT is not forwarded") }
        if method == .TRACE, bodyLength > 0 { throw .notFramable("a TRACE request cannot carry a body") }
        headers.remove(name: "content-length")
        headers.remove(name: "transfer-encoding")
        switch method {
        case .GET, .HEAD, .DELETE, .TRACE:
            if bodyLength > 0 { headers.add(name: "content-length", value: String(bodyLength)) }
        default:
            headers.add(name: "content-length", value: String(bodyLength))
        }
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
            connection.send(request) { unsent in self.dial(unsent, on: loop) }
            return
        }
        dial(request, on: loop)
    }

    /// Opens a new connection for `request` when the cap allows, or queues it until a connection
    /// closes (failing it with ``UpstreamError/queueTimeout`` at its deadline).
    private func dial(_ request: UpstreamRequest, on loop: any EventLoop) {
        let acquired = limiter.acquire { slot in
            loop.execute { self.granted(slot, to: request, on: loop) }
        }
        switch acquired {
        case .slot(let slot):
            connect(request, slot: slot, on: loop)
        case .queued(let id):
            let limiter = self.limiter
            loop.scheduleTask(deadline: request.deadline) {
                if limiter.cancel(id) { request.promise.fail(UpstreamError.queueTimeout) }
            }
            // Idle connections on other loops hold slots nobody there is using.
            Self.closeOneIdle(among: pools.values.filter { $0.eventLoop !== loop }[...])
        }
    }

    /// A queued call got a slot: an idle connection on its loop serves it if one appeared, else
    /// it dials.
    private func granted(_ slot: ConnectionSlot, to request: UpstreamRequest, on loop: any EventLoop) {
        guard let pool = pools[ObjectIdentifier(loop)]?.value, !pool.isShutdown else {
            slot.release()
            request.promise.fail(UpstreamError.unreachable("the gateway is shutting down"))
            return
        }
        if let connection = pool.takeIdle(keepIdle: settings.keepIdle) {
            slot.release()
            connection.send(request) { unsent in self.dial(unsent, on: loop) }
            return
        }
        connect(request, slot: slot, on: loop)
    }

    /// Closes one idle connection on the first of `pools` that has one.
    private static func closeOneIdle(among pools: ArraySlice<NIOLoopBoundBox<ConnectionPool>>) {
        guard let first = pools.first else { return }
        first.eventLoop.submit { first.value.closeOneIdle() }.whenSuccess { closed in
            if !closed { closeOneIdle(among: pools.dropFirst()) }
        }
    }

    private func connect(_ request: UpstreamRequest, slot: ConnectionSlot, on loop: any EventLoop) {
        guard let bound = pools[ObjectIdentifier(loop)] else {
            slot.release()
            request.promise.fail(UpstreamError.unreachable("no connection pool for this event loop"))
            return
        }
        let settings = self.settings
        let tls = self.tls
        let trustSource = self.trustSource
        let host = endpoint.host
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
                        try sync.addHandler(UpstreamTLSDiagnosis(host: host, trustSource: trustSource))
                    }
                    let connection = UpstreamConnection(pool: bound.value, settings: settings)
                    try sync.addHandler(UpstreamIdleGuard(connection: connection))
                    try sync.addHTTPClientHandlers()
                    try sync.addHandler(connection)
                }
            }
            .connect(host: host, port: endpoint.port)
            .assumeIsolated()
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    do {
                        let connection = try channel.pipeline.syncOperations.handler(type: UpstreamConnection.self)
                        connection.adopt(slot)
                        connection.send(request)
                    } catch {
                        slot.release()
                        request.promise.fail(UpstreamError.unreachable(String(describing: error)))
                        channel.close(promise: nil)
                    }
                case .failure(let error):
                    slot.release()
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
    /// No response head within `upstream.timeout`, the request not yet wholly sent.
    case headTimeout
    /// No response head within `upstream.timeout` after the whole request was sent: the provider
    /// may have run the call (and may still bill it).
    case unanswered
    /// The body went silent for longer than `upstream.idleTimeout`.
    case idleTimeout
    /// The connection could not be made.
    case unreachable(String)
    /// The provider closed the connection before the answer was complete.
    case closed
    /// Every connection allowed by `upstream.maxConnections` stayed busy until `upstream.timeout`.
    case queueTimeout
    /// The request cannot be framed safely (TRACE with a body, CONNECT); nothing was sent.
    case notFramable(String)
    /// The TLS handshake failed (a certificate refused, with the reason); nothing was sent.
    case tls(String)

    var isTimeout: Bool {
        switch self {
        // No connection in time is "unreachable" (502); 504 is for a provider that was reached.
        case .headTimeout, .unanswered, .idleTimeout, .queueTimeout: true
        case .connectTimeout, .unreachable, .closed, .notFramable, .tls: false
        }
    }

    var description: String {
        switch self {
        case .connectTimeout: "no connection to the provider in time"
        case .headTimeout: "the provider did not answer in time"
        case .unanswered: "the provider did not answer in time after the whole request was sent"
        case .idleTimeout: "the provider's answer stalled"
        case .unreachable(let reason): "the provider could not be reached: \(reason)"
        case .closed: "the provider closed the connection before the answer was complete"
        case .queueTimeout: "no connection to the provider became free in time (upstream.maxConnections)"
        case .notFramable(let reason): "the request cannot be forwarded: \(reason)"
        case .tls(let reason): "no TLS connection to the provider: \(reason)"
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

extension TimeAmount {
    /// Seconds given as a configuration `Double`.
    static func fromSeconds(_ value: Double) -> TimeAmount {
        .nanoseconds(Int64((value * 1_000_000_000).rounded()))
    }
}
