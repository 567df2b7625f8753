import NIOCore
import NIOHTTP1

/// What one upstream connection does with each event, decided as a value: no channel, no timer,
/// no promise is touched here. ``UpstreamConnection`` feeds it the channel's events and carries
/// out the action each returns (as postgres-nio's connection state machines are driven), so the
/// rules (an answer out of turn, informational heads, when a connection is reused, which timeout
/// failed a call and whether its request may be sent again) are tested without a socket.
///
/// Generic over the request and the body stream's source, which it only carries: tests drive it
/// with plain values.
struct UpstreamConnectionStateMachine<Request, Source> {
    enum State {
        case idle
        case waitingForHead(Request)
        case gathering(Request, HTTPResponseHead, ByteBuffer)
        case streaming(Source)
        case closed
    }

    private(set) var state = State.idle
    /// Counts requests on this connection; a stream's consumer names the one it belongs to.
    private(set) var exchange = 0
    /// Both sides keep the connection alive after this answer.
    private(set) var keepAlive = true
    /// The whole request has been handed to the kernel. A provider may answer early (a 413 or
    /// 429 before reading the body): such a connection is closed, not reused, while it still
    /// has request bytes to send.
    private(set) var requestSent = false
    /// The request is being written: a write that fails now failed in the first write system
    /// call, before any byte of the request left.
    private(set) var writing = false
    private(set) var unsent = false
    /// The request may be sent again on another connection if nothing of it left this one (a
    /// pooled connection found closed); false once its head was written or an answer came.
    private(set) var resendable = false
    /// The consumer of a stream has enough buffered: reads wait.
    private(set) var readPaused = false
    private(set) var readPending = false
    private(set) var lastRead: NIODeadline
    let idleTimeout: TimeAmount
    /// An answer of known length up to this is gathered whole, not streamed.
    let wholeBodyLimit: Int

    init(idleTimeout: TimeAmount, wholeBodyLimit: Int, now: NIODeadline = .now()) {
        self.idleTimeout = idleTimeout
        self.wholeBodyLimit = wholeBodyLimit
        self.lastRead = now
    }

    /// No request in flight: anything the provider sends now is out of turn.
    var isIdle: Bool {
        if case .idle = state { return true }
        return false
    }

    // MARK: sending

    enum SendAction {
        /// Write the request; exchange `exchange` begins.
        case write(exchange: Int)
        /// The connection cannot take it (busy, or closed): close it, and give the request back.
        case refuse(Request)
    }

    mutating func send(_ request: Request, channelActive: Bool, resendable: Bool) -> SendAction {
        guard case .idle = state, channelActive else {
            state = .closed
            return .refuse(request)
        }
        exchange += 1
        keepAlive = true
        requestSent = false
        unsent = false
        self.resendable = resendable
        state = .waitingForHead(request)
        writing = true
        return .write(exchange: exchange)
    }

    /// The request's writes were issued: true when the head timeout is to be armed (no answer
    /// or failure came while writing).
    mutating func writesIssued() -> Bool {
        writing = false
        if case .waitingForHead = state { return true }
        return false
    }

    /// The head of exchange `exchange` was written (true) or its write failed (false).
    mutating func headWritten(exchange: Int, _ succeeded: Bool) {
        guard exchange == self.exchange else { return }
        if succeeded {
            resendable = false
        } else if writing {
            unsent = true
        }
    }

    /// The whole request of exchange `exchange` was handed to the kernel.
    mutating func requestWritten(exchange: Int) {
        if exchange == self.exchange { requestSent = true }
    }

    // MARK: the answer

    enum HeadAction: Equatable {
        /// Nothing to do (not waiting for a head, or an informational one).
        case none
        /// An answer nobody asked for: the connection is out of step; close it.
        case close
        /// Gathering the body whole: arm the idle timeout at `idleDeadline`.
        case gather(idleDeadline: NIODeadline)
        /// Stream the body: make the stream and give it to ``streaming(_:)``; arm the idle
        /// timeout at `idleDeadline`.
        case stream(idleDeadline: NIODeadline)
    }

    /// A response head. `allocator` makes the buffer a body gathered whole goes into.
    mutating func receivedHead(
        _ head: HTTPResponseHead, requestMethod: HTTPMethod, now: NIODeadline, allocator: ByteBufferAllocator
    ) -> HeadAction {
        if case .idle = state { return .close }
        guard case .waitingForHead(let request) = state else { return .none }
        // An informational answer (100 Continue and the like) is not the answer.
        if head.status.code < 200 && head.status != .switchingProtocols { return .none }
        resendable = false
        // After 101 the bytes are another protocol's; a CONNECT's 2xx makes a tunnel.
        keepAlive =
            head.isKeepAlive && head.status != .switchingProtocols
            && !(requestMethod == .CONNECT && (200..<300).contains(head.status.code))
        lastRead = now
        let length = head.headers.first(name: "content-length").flatMap(Int.init)
        let eventStream = head.headers.first(name: "content-type")?.lowercased().hasPrefix("text/event-stream") ?? false
        if requestMethod != .HEAD, let length, length <= wholeBodyLimit, !eventStream {
            state = .gathering(request, head, allocator.buffer(capacity: length))
            return .gather(idleDeadline: now + idleTimeout)
        }
        return .stream(idleDeadline: now + idleTimeout)
    }

    /// The stream of the answer whose head returned `.stream`; returns the request it answers.
    mutating func streaming(_ source: Source) -> Request? {
        guard case .waitingForHead(let request) = state else { return nil }
        state = .streaming(source)
        return request
    }

    enum BodyAction {
        case none
        /// Pass the chunk to the stream; if it says stop, call ``pauseReads()``.
        case yield(Source, ByteBuffer)
        /// Body bytes with no request in flight: close the connection.
        case close
    }

    mutating func receivedBody(_ chunk: ByteBuffer, now: NIODeadline) -> BodyAction {
        lastRead = now
        switch state {
        case .gathering(let request, let head, var whole):
            state = .closed  // keeps `whole` uniquely referenced while it grows
            whole.writeImmutableBuffer(chunk)
            state = .gathering(request, head, whole)
            return .none
        case .streaming(let source):
            return .yield(source, chunk)
        case .idle:
            return .close
        case .waitingForHead, .closed:
            return .none
        }
    }

    /// The stream's consumer has enough: reads wait for ``consumerWantsMore(exchange:now:)``.
    mutating func pauseReads() {
        readPaused = true
    }

    enum EndAction {
        case none
        /// The answer gathered whole: succeed the request with it, then ``answerEnded(channelActive:)``.
        case deliver(Request, HTTPResponseHead, ByteBuffer)
        /// Finish the stream, then ``answerEnded(channelActive:)``.
        case finish(Source)
        /// An end with no request in flight: close the connection.
        case close
    }

    mutating func receivedEnd() -> EndAction {
        switch state {
        case .gathering(let request, let head, let whole): return .deliver(request, head, whole)
        case .streaming(let source): return .finish(source)
        case .idle: return .close
        case .waitingForHead, .closed: return .none
        }
    }

    enum EndedAction: Equatable {
        /// Back to the pool; read at once if a read waited.
        case reuse(readNow: Bool)
        case close
    }

    /// The answer is complete (the timer is cancelled by the caller): the connection is reused
    /// when both sides keep it alive and the whole request left, or closed.
    mutating func answerEnded(channelActive: Bool) -> EndedAction {
        guard keepAlive, requestSent, channelActive else { return .close }
        state = .idle
        readPaused = false
        let readNow = readPending
        readPending = false
        return .reuse(readNow: readNow)
    }

    // MARK: reads and the consumer

    /// The channel wants to read: true to read now, false while the consumer has enough.
    mutating func readRequested() -> Bool {
        if readPaused {
            readPending = true
            return false
        }
        return true
    }

    /// The consumer of exchange `exchange` wants more: true to read now.
    mutating func consumerWantsMore(exchange: Int, now: NIODeadline) -> Bool {
        guard exchange == self.exchange, case .streaming = state else { return false }
        readPaused = false
        lastRead = now
        guard readPending else { return false }
        readPending = false
        return true
    }

    /// The consumer of exchange `exchange` stopped (it finished, or gave up): true when the
    /// connection is to be closed (an answer still arriving cannot be followed by another request).
    func consumerFinished(exchange: Int) -> Bool {
        guard exchange == self.exchange, case .streaming = state else { return false }
        return true
    }

    // MARK: failures, timers, closing

    enum FailAction {
        case none
        /// Nothing of the request left: send it again elsewhere (once).
        case resend(Request)
        case fail(Request, UpstreamError)
        /// What arrived is passed on; the caller sees why it ended early.
        case deliverPartial(Request, HTTPResponseHead, ByteBuffer, UpstreamError)
        case finish(Source, UpstreamError)
    }

    mutating func fail(_ error: UpstreamError) -> FailAction {
        let previous = state
        state = .closed
        switch previous {
        case .waitingForHead(let request):
            if unsent, error == .closed, resendable {
                resendable = false
                return .resend(request)
            }
            return .fail(request, error)
        case .gathering(let request, let head, let whole):
            return .deliverPartial(request, head, whole, error)
        case .streaming(let source):
            return .finish(source, error)
        case .idle, .closed:
            return .none
        }
    }

    /// The channel closed: a request being written left nothing; then as ``fail(_:)`` with `.closed`.
    mutating func channelInactive() -> FailAction {
        if writing { unsent = true }
        return fail(.closed)
    }

    /// Closing the connection: the stream to finish (with `.closed`), if one was running.
    mutating func close() -> Source? {
        defer { state = .closed }
        if case .streaming(let source) = state { return source }
        return nil
    }

    enum TimerAction {
        case none
        /// Arm the timer again at this deadline.
        case rearm(NIODeadline)
        /// Fail the call (``fail(_:)``'s action) and close the connection.
        case failAndClose(FailAction)
    }

    mutating func timerFired(now: NIODeadline) -> TimerAction {
        switch state {
        case .waitingForHead:
            // Once the whole request is out the provider may be running it: a different outcome
            // for the charge (kept, at its hold) than a request cut off while being sent.
            return .failAndClose(fail(requestSent ? .unanswered : .headTimeout))
        case .gathering, .streaming:
            // A consumer that is slow to take the body is not a silent provider.
            if readPaused { return .rearm(now + idleTimeout) }
            if now - lastRead >= idleTimeout { return .failAndClose(fail(.idleTimeout)) }
            return .rearm(lastRead + idleTimeout)
        case .idle, .closed:
            return .none
        }
    }
}
