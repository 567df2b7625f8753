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
/// answer ended and both sides keep the connection alive. What to do with each event is decided
/// by ``UpstreamConnectionStateMachine``; this carries it out on the channel.
final class UpstreamConnection: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart
    typealias StateMachine = UpstreamConnectionStateMachine<UpstreamRequest, UpstreamStream.Source>

    private let pool: ConnectionPool
    private var machine: StateMachine
    /// This connection's place under `upstream.maxConnections`, given back when it closes.
    private var slot: ConnectionSlot?
    private var isInactive = false
    /// Where a request that never left this (pooled) connection is sent again, once.
    private var onUnsent: ((UpstreamRequest) -> Void)?
    private var context: ChannelHandlerContext?
    private var timer: Scheduled<Void>?
    fileprivate(set) var idleSince = NIODeadline.now()

    init(pool: ConnectionPool, settings: UpstreamClient.Settings) {
        self.pool = pool
        self.machine = StateMachine(idleTimeout: settings.idleTimeout, wholeBodyLimit: settings.wholeBodyLimit)
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
    var isIdle: Bool { machine.isIdle }

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
        let action = machine.send(request, channelActive: context?.channel.isActive ?? false, resendable: onUnsent != nil)
        guard let context, case .write(let current) = action else {
            context?.close(promise: nil)
            if let onUnsent { onUnsent(request) } else { request.promise.fail(UpstreamError.closed) }
            return
        }
        self.onUnsent = onUnsent
        let headWritten = context.eventLoop.makePromise(of: Void.self)
        headWritten.futureResult.assumeIsolated().whenComplete { [self] result in
            machine.headWritten(exchange: current, (try? result.get()) != nil)
            if !machine.resendable { self.onUnsent = nil }
        }
        context.write(wrapOutboundOut(.head(request.head)), promise: headWritten)
        if let body = request.body, body.readableBytes > 0 {
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        let sent = context.eventLoop.makePromise(of: Void.self)
        sent.futureResult.assumeIsolated().whenSuccess { [self] in machine.requestWritten(exchange: current) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: sent)
        if machine.writesIssued() { arm(at: request.deadline) }
    }

    func close() {
        machine.close()?.finish(UpstreamError.closed)
        context?.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            let method: HTTPMethod
            if case .waitingForHead(let request) = machine.state { method = request.head.method } else { method = .GET }
            switch machine.receivedHead(head, requestMethod: method, now: .now(), allocator: context.channel.allocator) {
            case .none: return
            case .close: close()
            case .gather(let deadline):
                onUnsent = nil
                arm(at: deadline)
            case .stream(let deadline):
                onUnsent = nil
                arm(at: deadline)
                let delegate = UpstreamStreamDelegate(
                    connection: NIOLoopBound(self, eventLoop: context.eventLoop), exchange: machine.exchange)
                let stream = UpstreamStream.makeSequence(
                    backPressureStrategy: .init(lowWatermark: 2, highWatermark: 8), finishOnDeinit: false, delegate: delegate)
                if let request = machine.streaming(stream.source) {
                    request.promise.succeed(UpstreamResponse(head: head, body: .stream(stream.sequence)))
                }
            }
        case .body(let chunk):
            switch machine.receivedBody(chunk, now: .now()) {
            case .none: break
            case .yield(let source, let chunk): if source.yield(chunk) == .stopProducing { machine.pauseReads() }
            case .close: close()
            }
        case .end:
            switch machine.receivedEnd() {
            case .none: return
            case .close:
                close()
                return
            case .deliver(let request, let head, let whole):
                request.promise.succeed(UpstreamResponse(head: head, body: .whole(whole, failure: nil)))
            case .finish(let source):
                source.finish()
            }
            answerEnded(context: context)
        }
    }

    /// The answer is complete: the connection goes back to its pool, or is closed.
    private func answerEnded(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        switch machine.answerEnded(channelActive: context.channel.isActive) {
        case .close:
            close()
        case .reuse(let readNow):
            idleSince = .now()
            if readNow { context.read() }
            pool.release(self)
        }
    }

    func read(context: ChannelHandlerContext) {
        if machine.readRequested() { context.read() }
    }

    func consumerWantsMore(exchange: Int) {
        if machine.consumerWantsMore(exchange: exchange, now: .now()), let context { context.read() }
    }

    /// The stream's consumer stopped (it finished, or gave up): an answer still arriving cannot
    /// be followed by another request on this connection.
    func consumerFinished(exchange: Int) {
        guard machine.consumerFinished(exchange: exchange) else { return }
        timer?.cancel()
        timer = nil
        close()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A refused handshake says why; anything else is told as the close that follows.
        if let failure = error as? UpstreamTLSFailure { perform(machine.fail(.tls(failure.reason))) }
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
        perform(machine.channelInactive())
        context.fireChannelInactive()
    }

    /// Carries out a failure the state machine decided.
    private func perform(_ action: StateMachine.FailAction) {
        switch action {
        case .none: break
        case .resend(let request):
            // Nothing of it left: the provider never saw this request.
            let resend = onUnsent
            onUnsent = nil
            if let resend { resend(request) } else { request.promise.fail(UpstreamError.closed) }
        case .fail(let request, let error): request.promise.fail(error)
        case .deliverPartial(let request, let head, let whole, let error):
            request.promise.succeed(UpstreamResponse(head: head, body: .whole(whole, failure: error)))
        case .finish(let source, let error): source.finish(error)
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
        switch machine.timerFired(now: .now()) {
        case .none: break
        case .rearm(let deadline): arm(at: deadline)
        case .failAndClose(let action):
            perform(action)
            context?.close(promise: nil)
        }
    }
}
