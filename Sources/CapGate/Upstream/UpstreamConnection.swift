import NIOCore
import NIOHTTP1

/// One event loop's idle connections, most recently used first. Used only on its loop.
final class ConnectionPool {
    private var idle: [UpstreamConnection] = []
    private let maxIdle: Int
    private let limiter: ConnectionLimiter
    private(set) var isShutdown = false

    init(maxIdle: Int, limiter: ConnectionLimiter) {
        self.maxIdle = maxIdle
        self.limiter = limiter
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

    /// Keeps a connection whose answer ended; closes it instead when calls wait for a slot under
    /// `upstream.maxConnections` (its slot goes to the first of them).
    func release(_ connection: UpstreamConnection) {
        guard !isShutdown, idle.count < maxIdle, !limiter.hasWaiters else {
            connection.close()
            return
        }
        idle.append(connection)
    }

    /// Closes the least recently used idle connection, freeing its slot for a call waiting on
    /// another loop; false when there is none.
    func closeOneIdle() -> Bool {
        guard !idle.isEmpty else { return false }
        idle.removeFirst().close()
        return true
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
    /// This connection's place under `upstream.maxConnections`, given back when it closes.
    private var slot: ConnectionSlot?
    private var isInactive = false
    /// The request is being written (inside ``send(_:onUnsent:)``): a write that fails now failed
    /// in the first write system call, before any byte of the request left.
    private var writing = false
    private var unsent = false
    /// Where a request that never left this (pooled) connection is sent again, once.
    private var onUnsent: ((UpstreamRequest) -> Void)?
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
        slot?.release()
        slot = nil
    }

    /// No request in flight: anything the provider sends now is out of turn.
    var isIdle: Bool {
        if case .idle = state { return true }
        return false
    }

    /// Takes the slot this connection was dialled with; a connection already closed gives it back.
    func adopt(_ slot: ConnectionSlot) {
        if isInactive || context == nil {
            slot.release()
        } else {
            self.slot = slot
        }
    }

    /// Sends `request`. `onUnsent` (for a connection taken from the pool) gets the request back
    /// when the connection turns out to be closed before any byte of it left: found closed, or
    /// the first write failed at once. Once bytes may have left, a failure fails the call.
    func send(_ request: UpstreamRequest, onUnsent: ((UpstreamRequest) -> Void)? = nil) {
        guard let context, case .idle = state, context.channel.isActive else {
            state = .closed
            context?.close(promise: nil)
            if let onUnsent { onUnsent(request) } else { request.promise.fail(UpstreamError.closed) }
            return
        }
        exchange += 1
        keepAlive = true
        requestSent = false
        unsent = false
        self.onUnsent = onUnsent
        state = .waitingForHead(request)
        let current = exchange
        writing = true
        let headWritten = context.eventLoop.makePromise(of: Void.self)
        headWritten.futureResult.assumeIsolated().whenComplete { [self] result in
            guard exchange == current else { return }
            switch result {
            case .success: self.onUnsent = nil
            case .failure: if writing { unsent = true }
            }
        }
        context.write(wrapOutboundOut(.head(request.head)), promise: headWritten)
        if let body = request.body, body.readableBytes > 0 {
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        let sent = context.eventLoop.makePromise(of: Void.self)
        sent.futureResult.assumeIsolated().whenSuccess { [self] in
            if exchange == current { requestSent = true }
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: sent)
        writing = false
        if case .waitingForHead = state { arm(at: request.deadline) }
    }

    func close() {
        if case .streaming(let source) = state { source.finish(UpstreamError.closed) }
        state = .closed
        context?.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            if case .idle = state {
                // An answer nobody asked for: the connection is out of step.
                close()
                return
            }
            guard case .waitingForHead(let request) = state else { return }
            // An informational answer (100 Continue and the like) is not the answer.
            if head.status.code < 200 && head.status != .switchingProtocols { return }
            onUnsent = nil
            // After 101 the bytes are another protocol's; a CONNECT's 2xx makes a tunnel.
            keepAlive =
                head.isKeepAlive && head.status != .switchingProtocols
                && !(request.head.method == .CONNECT && (200..<300).contains(head.status.code))
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
            case .idle:
                close()
            case .waitingForHead, .closed:
                break
            }
        case .end:
            switch state {
            case .gathering(let request, let head, let whole):
                request.promise.succeed(UpstreamResponse(head: head, body: .whole(whole, failure: nil)))
            case .streaming(let source):
                source.finish()
            case .idle:
                close()
                return
            case .waitingForHead, .closed:
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
        // A refused handshake says why; anything else is told as the close that follows.
        if let failure = error as? UpstreamTLSFailure { fail(.tls(failure.reason)) }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        isInactive = true
        timer?.cancel()
        timer = nil
        pool.remove(self)
        // The slot first, so that a call sent again can have it.
        slot?.release()
        slot = nil
        if writing { unsent = true }
        fail(.closed)
        context.fireChannelInactive()
    }

    private func fail(_ error: UpstreamError) {
        let previous = state
        state = .closed
        switch previous {
        case .waitingForHead(let request):
            if unsent, error == .closed, let onUnsent {
                // Nothing of it left: the provider never saw this request.
                self.onUnsent = nil
                onUnsent(request)
                return
            }
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
            // Once the whole request is out the provider may be running it: a different outcome
            // for the charge (kept, at its hold) than a request cut off while being sent.
            fail(requestSent ? .unanswered : .headTimeout)
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
