import NIOCore
import NIOHTTP1
import Testing

@testable import CapGate

/// The upstream connection's rules, decided without a socket (``UpstreamConnectionStateMachine``):
/// requests are numbers, a body stream's source is a name.
@Suite("Upstream connection state machine")
struct UpstreamConnectionStateMachineTests {
    typealias Machine = UpstreamConnectionStateMachine<Int, String>
    static let allocator = ByteBufferAllocator()
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    static func machine() -> Machine { Machine(idleTimeout: .seconds(5), wholeBodyLimit: 100, now: start) }

    static func head(_ status: HTTPResponseStatus, _ fields: [(String, String)] = [], keepAlive: Bool = true) -> HTTPResponseHead {
        var head = HTTPResponseHead(version: .http1_1, status: status, headers: HTTPHeaders(fields))
        if !keepAlive { head.headers.add(name: "connection", value: "close") }
        return head
    }

    /// A request sent and wholly written on `machine`.
    static func sent(_ machine: inout Machine, request: Int = 1, resendable: Bool = false) -> Int {
        guard case .write(let exchange) = machine.send(request, channelActive: true, resendable: resendable) else {
            Issue.record("not sent")
            return 0
        }
        machine.headWritten(exchange: exchange, true)
        machine.requestWritten(exchange: exchange)
        let armed = machine.writesIssued()
        #expect(armed)
        return exchange
    }

    @Test("a small answer of known length is gathered whole and the connection is reused; a second request counts a new exchange")
    func gatherAndReuse() {
        var m = Self.machine()
        #expect(Self.sent(&m) == 1)
        let now = Self.start + .seconds(1)
        #expect(
            m.receivedHead(Self.head(.ok, [("content-length", "5")]), requestMethod: .POST, now: now, allocator: Self.allocator)
                == .gather(idleDeadline: now + .seconds(5)))
        guard case .none = m.receivedBody(ByteBuffer(string: "hel"), now: now) else { Issue.record("body"); return }
        guard case .none = m.receivedBody(ByteBuffer(string: "lo"), now: now) else { Issue.record("body"); return }
        guard case .deliver(let request, let head, let whole) = m.receivedEnd() else { Issue.record("end"); return }
        #expect(request == 1 && head.status == .ok && String(buffer: whole) == "hello")
        #expect(m.answerEnded(channelActive: true) == .reuse(readNow: false))
        #expect(m.isIdle)
        #expect(Self.sent(&m, request: 2) == 2)
    }

    @Test("streamed: an event stream, a HEAD, a body past the whole-body limit or of unknown length")
    func streamed() {
        for (head, method) in [
            (Self.head(.ok, [("content-type", "text/event-stream"), ("content-length", "5")]), HTTPMethod.POST),
            (Self.head(.ok, [("content-length", "5")]), .HEAD), (Self.head(.ok, [("content-length", "101")]), .POST),
            (Self.head(.ok), .POST),
        ] {
            var m = Self.machine()
            _ = Self.sent(&m)
            guard case .stream = m.receivedHead(head, requestMethod: method, now: Self.start, allocator: Self.allocator) else {
                Issue.record("\(method) \(head.headers) not streamed")
                continue
            }
            #expect(m.streaming("s") == 1)
            guard case .yield("s", let chunk) = m.receivedBody(ByteBuffer(string: "x"), now: Self.start) else {
                Issue.record("no yield")
                continue
            }
            #expect(chunk.readableBytes == 1)
            guard case .finish("s") = m.receivedEnd() else { Issue.record("no finish"); return }
        }
    }

    @Test("informational heads are skipped; an answer out of turn (no request in flight) closes the connection")
    func informationalAndOutOfTurn() {
        var m = Self.machine()
        _ = Self.sent(&m)
        #expect(m.receivedHead(Self.head(.continue), requestMethod: .POST, now: Self.start, allocator: Self.allocator) == .none)
        guard case .waitingForHead = m.state else { Issue.record("left waiting"); return }
        var idle = Self.machine()
        #expect(idle.receivedHead(Self.head(.ok), requestMethod: .GET, now: Self.start, allocator: Self.allocator) == .close)
        var ended = Self.machine()
        guard case .close = ended.receivedEndOnIdle() else { Issue.record("end out of turn"); return }
    }

    @Test("not reused: the provider closes, a 101, a CONNECT's 2xx, a request not wholly sent, a closed channel")
    func notReused() {
        func ended(
            _ head: HTTPResponseHead, method: HTTPMethod = .POST, requestWritten: Bool = true, active: Bool = true
        )
            -> Machine
            .EndedAction
        {
            var m = Self.machine()
            guard case .write(let exchange) = m.send(1, channelActive: true, resendable: false) else { return .close }
            if requestWritten { m.requestWritten(exchange: exchange) }
            _ = m.writesIssued()
            _ = m.receivedHead(head, requestMethod: method, now: Self.start, allocator: Self.allocator)
            _ = m.streaming("s")
            _ = m.receivedEnd()
            return m.answerEnded(channelActive: active)
        }
        let small = [("content-length", "0")]
        #expect(ended(Self.head(.ok, small)) == .reuse(readNow: false))
        #expect(ended(Self.head(.ok, small, keepAlive: false)) == .close)
        #expect(ended(Self.head(.switchingProtocols)) == .close)
        #expect(ended(Self.head(.ok, small), method: .CONNECT) == .close)
        #expect(ended(Self.head(.tooManyRequests, small), requestWritten: false) == .close)
        #expect(ended(Self.head(.ok, small), active: false) == .close)
    }

    @Test("a pooled connection found closed gives its request back once, only if nothing of it left and no answer came")
    func resend() {
        // Closed while its first write failed: sent again.
        var m = Self.machine()
        guard case .write(let exchange) = m.send(7, channelActive: true, resendable: true) else { Issue.record("send"); return }
        m.headWritten(exchange: exchange, false)
        guard case .resend(7) = m.channelInactive() else { Issue.record("not resent"); return }
        // The head left: the provider may have it; the call fails.
        var left = Self.machine()
        _ = Self.sent(&left, request: 8, resendable: true)
        guard case .fail(8, .closed) = left.channelInactive() else { Issue.record("resent after the head left"); return }
        // A fresh connection (not from the pool) never resends.
        var fresh = Self.machine()
        guard case .write(let e) = fresh.send(9, channelActive: true, resendable: false) else { Issue.record("send"); return }
        fresh.headWritten(exchange: e, false)
        guard case .fail(9, .closed) = fresh.channelInactive() else { Issue.record("fresh resent"); return }
        // Busy or closed: refused at once.
        var busy = Self.machine()
        _ = Self.sent(&busy)
        guard case .refuse(2) = busy.send(2, channelActive: true, resendable: true) else { Issue.record("busy took it"); return }
        var closed = Self.machine()
        guard case .refuse(3) = closed.sendOnClosedChannel(3) else { Issue.record("closed took it"); return }
    }

    @Test(
        "timeouts: no head before the request left is headTimeout, after it unanswered; a silent body idleTimeout; a paused consumer is not silence"
    )
    func timeouts() {
        var cut = Self.machine()
        guard case .write = cut.send(1, channelActive: true, resendable: false) else { Issue.record("send"); return }
        _ = cut.writesIssued()
        guard case .failAndClose(.fail(1, .headTimeout)) = cut.timerFired(now: Self.start + .seconds(60)) else {
            Issue.record("not headTimeout"); return
        }
        var waited = Self.machine()
        _ = Self.sent(&waited)
        guard case .failAndClose(.fail(1, .unanswered)) = waited.timerFired(now: Self.start + .seconds(60)) else {
            Issue.record("not unanswered"); return
        }

        var silent = Self.machine()
        _ = Self.sent(&silent)
        _ = silent.receivedHead(Self.head(.ok), requestMethod: .POST, now: Self.start, allocator: Self.allocator)
        _ = silent.streaming("s")
        _ = silent.receivedBody(ByteBuffer(string: "x"), now: Self.start + .seconds(2))
        guard case .rearm(let at) = silent.timerFired(now: Self.start + .seconds(5)), at == Self.start + .seconds(7) else {
            Issue.record("not rearmed from the last read"); return
        }
        silent.pauseReads()
        guard case .rearm(let later) = silent.timerFired(now: Self.start + .seconds(30)), later == Self.start + .seconds(35) else {
            Issue.record("a paused consumer counted as silence"); return
        }
        let readNow = silent.readRequested()
        #expect(!readNow, "reads wait while paused")
        let resumed = silent.consumerWantsMore(exchange: 1, now: Self.start + .seconds(31))
        #expect(resumed, "the read that waited goes now")
        guard case .failAndClose(.finish("s", .idleTimeout)) = silent.timerFired(now: Self.start + .seconds(36)) else {
            Issue.record("not idleTimeout"); return
        }
    }

    @Test("a failure mid-answer passes on what arrived with the reason; a consumer of an old exchange changes nothing")
    func failures() {
        var m = Self.machine()
        _ = Self.sent(&m)
        _ = m.receivedHead(Self.head(.ok, [("content-length", "10")]), requestMethod: .POST, now: Self.start, allocator: Self.allocator)
        _ = m.receivedBody(ByteBuffer(string: "part"), now: Self.start)
        guard case .deliverPartial(1, _, let whole, .closed) = m.channelInactive(), String(buffer: whole) == "part" else {
            Issue.record("partial not passed on"); return
        }
        var streaming = Self.machine()
        _ = Self.sent(&streaming)
        _ = streaming.receivedHead(Self.head(.ok), requestMethod: .POST, now: Self.start, allocator: Self.allocator)
        _ = streaming.streaming("s")
        #expect(!streaming.consumerFinished(exchange: 0), "an old exchange's consumer")
        #expect(streaming.consumerFinished(exchange: 1))
        #expect(streaming.close() == "s", "closing finishes the stream")
        #expect(streaming.close() == nil)
    }
}

extension UpstreamConnectionStateMachine {
    /// An end arriving with no request in flight.
    mutating func receivedEndOnIdle() -> EndAction { receivedEnd() }
    /// A request offered while the channel is closed.
    mutating func sendOnClosedChannel(_ request: Request) -> SendAction {
        send(request, channelActive: false, resendable: true)
    }
}
