import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// One client TCP connection that writes exactly the bytes a test gives it (a partial head, a
/// body cut short, nothing at all) and reads HTTP/1.1 answers with a `Content-Length`. Records
/// when each answer was complete, so a test measures a call from its send to its answer without
/// its own scheduling in between.
final class RawConnection: Sendable {
    struct Answer: Sendable {
        var status: Int
        var head: String
        var body: String
        /// When its last byte arrived.
        var at: ContinuousClock.Instant
    }

    fileprivate struct State {
        var buffer: [UInt8] = []
        var answers: [Answer] = []
        var closed = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    let channel: any Channel
    private let sink: Sink

    private init(channel: any Channel, sink: Sink) {
        self.channel = channel
        self.sink = sink
    }

    /// Connects to 127.0.0.1:`port`, from the loopback address `source` when one is given (any of
    /// 127.0.0.0/8: a second client address on this machine).
    static func open(port: Int, from source: String? = nil) async throws -> RawConnection {
        let sink = Sink()
        var bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(sink) }
            }
        if let source { bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: source, port: 0)) }
        let channel = try await bootstrap.connect(host: "127.0.0.1", port: port).get()
        return RawConnection(channel: channel, sink: sink)
    }

    /// Writes `text` as it is.
    func send(_ text: String) async throws {
        try await channel.writeAndFlush(ByteBuffer(string: text))
    }

    func close() {
        channel.close(promise: nil)
    }

    var isClosed: Bool { sink.state.withLock { $0.closed } }

    /// True when a complete answer is waiting to be taken.
    var hasAnswer: Bool { sink.state.withLock { !$0.answers.isEmpty } }

    /// The next complete answer, or nil when the connection closed or `limit` passed first.
    func answer(within limit: Duration) async -> Answer? {
        let deadline = ContinuousClock.now + limit
        while true {
            let (answer, closed) = sink.state.withLock { state -> (Answer?, Bool) in
                state.answers.isEmpty ? (nil, state.closed) : (state.answers.removeFirst(), state.closed)
            }
            if let answer { return answer }
            if closed || ContinuousClock.now >= deadline { return nil }
            await change(before: deadline)
        }
    }

    /// True once the server closed the connection, waiting at most `limit`.
    func closed(within limit: Duration) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while true {
            if sink.state.withLock({ $0.closed }) { return true }
            if ContinuousClock.now >= deadline { return false }
            await change(before: deadline)
        }
    }

    /// Returns at the next byte or close, or at `deadline`.
    private func change(before deadline: ContinuousClock.Instant) async {
        let wake = channel.eventLoop.scheduleTask(in: TimeAmount(deadline - ContinuousClock.now)) { self.wakeAll() }
        await withCheckedContinuation { continuation in
            let ready = sink.state.withLock { state -> Bool in
                if state.closed || !state.answers.isEmpty { return true }
                state.waiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
        wake.cancel()
    }

    private func wakeAll() { sink.wakeAll() }

    /// Takes one complete answer (head and `Content-Length` body) off the front of `buffer`.
    static func parse(_ buffer: inout [UInt8], at: ContinuousClock.Instant) -> Answer? {
        guard buffer.count >= 4,
            let end = (0...(buffer.count - 4)).first(where: {
                buffer[$0] == 13 && buffer[$0 + 1] == 10 && buffer[$0 + 2] == 13 && buffer[$0 + 3] == 10
            })
        else {
            return nil
        }
        let head = String(decoding: buffer[..<end], as: UTF8.self)
        let lines = head.split(separator: "\r\n")
        let status = lines.first.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
        let length =
            lines.dropFirst().compactMap { line -> Int? in
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
                return Int(parts[1].trimmingCharacters(in: .whitespaces))
            }.first ?? 0
        guard buffer.count >= end + 4 + length else { return nil }
        let body = String(decoding: buffer[(end + 4)..<(end + 4 + length)], as: UTF8.self)
        buffer.removeFirst(end + 4 + length)
        return Answer(status: status, head: head, body: body, at: at)
    }

    /// The channel's last handler: keeps what arrived and wakes whoever waits for it.
    fileprivate final class Sink: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let state = Mutex(State())

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            received(buffer.readBytes(length: buffer.readableBytes) ?? [], closed: false)
        }

        func channelInactive(context: ChannelHandlerContext) {
            received([], closed: true)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }

        func received(_ bytes: [UInt8], closed: Bool) {
            let now = ContinuousClock.now
            state.withLock { state in
                state.buffer += bytes
                while let answer = RawConnection.parse(&state.buffer, at: now) { state.answers.append(answer) }
                if closed { state.closed = true }
            }
            wakeAll()
        }

        func wakeAll() {
            let waiters = state.withLock { state in
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }
}
