import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
import NIOSSL
import NIOTLS

/// The gateway's HTTP/1.1 server with its time limits on clients:
///
/// - `http.idleTimeout`: Hummingbird's own idle timeout (`HTTP1Channel.Configuration.idleTimeout`):
///   a connection with no request in progress, or whose request stopped arriving, is closed
///   after that much silence (a connection opened and never used included). A request whose
///   answer is being written (a long stream) is never cut by it.
/// - `http.headerTimeout`: once the first byte of a request arrives, its head (request line and
///   headers) must be complete within this time, else the connection is closed. The idle
///   timeout alone would let a client that sends a byte every few seconds hold a connection
///   forever; Hummingbird has no such limit, so ``HeaderDeadlineHandler`` (in front of the HTTP
///   decoder, where the bytes arrive) and ``RequestHeadSignal`` (behind it, where the decoded head
///   appears) add it.
///
/// - `http.bodyTimeout`: a request's body must arrive whole within this time of its head, else
///   the body reader gets a 408 `request_timeout` (``BodyDeadline``) and the connection closes: a
///   client trickling a byte every few seconds cannot hold a connection and its body budget.
/// - `http.idleTimeout` for answers too: a client that reads nothing of its answer for that long
///   (the connection stays unwritable) loses it (``RequestHeadSignal``): the connection closes,
///   so the upstream connection feeding it is freed (the charge stands, as for any disconnect).
///
/// With `http.tls.certificate` and `http.tls.key` set (``ListenerTLS``) each connection begins
/// with a TLS handshake (TLS 1.2 or later, ALPN `http/1.1`) in front of all of the above; the
/// handshake must finish within `http.idleTimeout` (Hummingbird's idle timer counts only decoded
/// HTTP parts as activity, so a handshake sent a byte at a time gains nothing). Without them no
/// TLS handler is added at all.
///
/// The connection limit (`http.maxConnections`) is Hummingbird's `MaximumAvailableConnections`:
/// at the limit the server stops accepting, so further connections wait in the listen backlog
/// (the kernel's queue) until one closes.
extension CapGateConfiguration {
    /// The listen backlog: connections the kernel completes before the server accepts them.
    /// Hummingbird's default (256) overflows when a burst of clients connects at once (the
    /// kernel then drops them, and a client that thought it was connected gets a reset); the
    /// kernel caps it at `net.core.somaxconn` (4096 on current Linux).
    static let listenBacklog = 4096

    /// The HTTP server with `http.idleTimeout`, `http.headerTimeout` and `http.bodyTimeout`, over
    /// `tls` when `http.tls.*` are set.
    func httpServer(tls: ListenerTLS?) -> HTTPServerBuilder {
        .gateway(
            idleTimeout: .seconds(httpIdleTimeout), headerTimeout: .seconds(httpHeaderTimeout), bodyTimeout: .seconds(httpBodyTimeout),
            tls: tls)
    }

    /// The listen address and `http.maxConnections`.
    func serverConfiguration(logger: Logger) -> ApplicationConfiguration {
        ApplicationConfiguration(
            address: .hostname(host, port: port), serverName: nil, backlog: Self.listenBacklog,
            availableConnectionsDelegate: MaximumAvailableConnections(httpMaxConnections, logger: logger)
        )
    }
}

extension HTTPServerBuilder {
    static func gateway(idleTimeout: Duration, headerTimeout: Duration, bodyTimeout: Duration, tls: ListenerTLS? = nil) -> HTTPServerBuilder
    {
        HTTPServerBuilder { responder in
            HeaderDeadlineChannel(
                base: HTTP1Channel(
                    responder: responder,
                    configuration: .init(
                        additionalChannelHandlers: [
                            RequestHeadSignal(bodyTimeout: TimeAmount(bodyTimeout), writeStallTimeout: TimeAmount(idleTimeout))
                        ],
                        idleTimeout: TimeAmount(idleTimeout))
                ),
                headerTimeout: TimeAmount(headerTimeout),
                tls: tls
            )
        }
    }
}

/// Hummingbird's HTTP/1 child channel with a ``HeaderDeadlineHandler`` in front of its pipeline,
/// and in front of that, when the listener serves HTTPS, the TLS handler.
struct HeaderDeadlineChannel: ServerChildChannel {
    let base: HTTP1Channel
    let headerTimeout: TimeAmount
    /// The listener's TLS; nil serves plain HTTP with no TLS handler in the pipeline.
    var tls: ListenerTLS? = nil

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<HTTP1Channel.Value> {
        do {
            let pipeline = channel.pipeline.syncOperations
            if let tls {
                // The context current now: a SIGHUP reload later changes new connections only.
                try pipeline.addHandler(NIOSSLServerHandler(context: tls.context))
                try pipeline.addHandler(TLSHandshakeLog(logger: logger))
            }
            try pipeline.addHandler(HeaderDeadlineHandler(timeout: headerTimeout))
        } catch {
            return channel.eventLoop.makeFailedFuture(error)
        }
        return base.setup(channel: channel, logger: logger)
    }

    func handle(value: HTTP1Channel.Value, logger: Logger) async {
        await base.handle(value: value, logger: logger)
    }
}

/// What ``RequestHeadSignal`` tells ``HeaderDeadlineHandler`` (an outbound user event travels
/// from the decoded side of the pipeline to its front).
enum RequestHeadEvent: Sendable {
    /// A request's head was decoded.
    case head
    /// A request's last part was decoded: the next byte starts a new head.
    case end
}

/// Sits first in the pipeline and sees the raw bytes: the first byte of a request's head arms a
/// timer of `http.headerTimeout`, the decoded head (``RequestHeadEvent/head``) disarms it; a timer
/// that fires closes the connection.
final class HeaderDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let timeout: TimeAmount
    /// True between requests: the next byte read starts a head.
    private var awaitingHead = true
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if awaitingHead && deadline == nil && unwrapInboundIn(data).readableBytes > 0 {
            let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
            deadline = context.eventLoop.scheduleTask(in: timeout) {
                loopBound.value.close(promise: nil)
            }
        }
        context.fireChannelRead(data)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? RequestHeadEvent else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        switch event {
        case .head:
            awaitingHead = false
            disarm()
        case .end:
            awaitingHead = true
        }
        promise?.succeed()
    }

    func channelInactive(context: ChannelHandlerContext) {
        disarm()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        disarm()
    }

    private func disarm() {
        deadline?.cancel()
        deadline = nil
    }
}

/// Sits behind the HTTP decoder and tells ``HeaderDeadlineHandler`` when a request's head, and
/// its end, were decoded. It also holds the body to `http.bodyTimeout`: a request whose end has
/// not arrived by the end of the read that brought its head arms a timer; if the end is still
/// missing when it fires, the body reader gets ``BodyDeadline/error`` (a 408 that closes the
/// connection). A body that comes with its head arms nothing.
///
/// And it closes a connection that stays unwritable (its client reads nothing of the answer)
/// for `writeStallTimeout` (`http.idleTimeout`): the answer's writer fails, and the provider's
/// stream feeding it is let go. An answer the client keeps reading, however slowly, is never cut.
final class RequestHeadSignal: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    let bodyTimeout: TimeAmount
    let writeStallTimeout: TimeAmount
    /// A head was read and its end was not.
    private var inBody = false
    private var deadline: Scheduled<Void>?
    private var stall: Scheduled<Void>?

    init(bodyTimeout: TimeAmount, writeStallTimeout: TimeAmount) {
        self.bodyTimeout = bodyTimeout
        self.writeStallTimeout = writeStallTimeout
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            stall?.cancel()
            stall = nil
        } else if stall == nil {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            stall = context.eventLoop.scheduleTask(in: writeStallTimeout) {
                let (handler, context) = bound.value
                handler.stall = nil
                if !context.channel.isWritable { context.close(promise: nil) }
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(var head):
            inBody = true
            context.triggerUserOutboundEvent(RequestHeadEvent.head, promise: nil)
            // NIO's encoder frames every answer to CONNECT without a body (as a tunnel's), so the
            // 405's envelope never goes out and a client would wait for a body that never comes:
            // the connection closes after the answer (Hummingbird closes on the request's
            // `connection: close`), and the client reads the 405 to the close.
            if head.method == .connect {
                head.headerFields[.connection] = "close"
                context.fireChannelRead(wrapInboundOut(.head(head)))
                return
            }
        case .end:
            inBody = false
            disarm()
            context.triggerUserOutboundEvent(RequestHeadEvent.end, promise: nil)
        case .body: break
        }
        context.fireChannelRead(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if inBody && deadline == nil {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            deadline = context.eventLoop.scheduleTask(in: bodyTimeout) {
                let (handler, context) = bound.value
                handler.deadline = nil
                guard handler.inBody else { return }
                handler.inBody = false
                context.fireErrorCaught(BodyDeadline.error)
            }
        }
        context.fireChannelReadComplete()
    }

    private func disarm() {
        deadline?.cancel()
        deadline = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        disarm()
        stall?.cancel()
        stall = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        disarm()
        stall?.cancel()
        stall = nil
    }
}

/// `http.bodyTimeout`'s answer (SPEC §3: `408 request_timeout`), delivered to whoever is reading
/// the body; `Connection: close` ends the connection after it.
enum BodyDeadline {
    static let error = GatewayError(
        .requestTimeout, "request_timeout",
        "The request body did not arrive within the gateway's time limit (http.bodyTimeout); nothing was charged. Send it again.",
        headers: [.connection: "close"])
}
