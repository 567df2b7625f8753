import NIOCore
import NIOHTTP1

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
