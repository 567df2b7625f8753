import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// A raw HTTP/1.1 provider that frames requests as a server does (a head ends at the empty line,
/// a body is `content-length` long, nothing else is a body) and records every request it reads,
/// so a test sees exactly what reached the provider, including a request smuggled in a body.
///
/// Answers, by the path's last segment (query ignored), all keep-alive with `content-length`:
/// - `close-on-read`: no answer, the connection is closed;
/// - `slow`: 200 after 300 ms;
/// - `stall`: a head declaring 1 MB (so the answer streams), 10 bytes of it, then silence;
/// - `idle-bytes`: 200, then 100 ms later (the connection idle) a whole unasked-for answer;
/// - `headers`: 200 with `connection: keep-alive, x-secret-thing`, `x-secret-thing`, `x-kept`,
///   `anthropic-organization-id` and `anthropic-organization-name`, the account's rate-limit
///   fields (`anthropic-ratelimit-*`, `x-ratelimit-*`) and two `set-cookie`;
/// - a `TRACE` to any path: 200 echoing the request's head (as a TRACE answer does);
/// - anything else: 200 with a Messages API answer (`usage` included).
final class RecordingProvider: Sendable {
    struct Recorded: Sendable {
        /// `METHOD target`.
        var line: String
        /// Lowercased names, values as sent (repeated fields joined by ", ").
        var headers: [String: String]
        var body: String
    }

    let channel: any Channel
    /// One thread, so that a connection's close and the next one's accept are seen in order.
    let group: MultiThreadedEventLoopGroup
    let accepted = Atomic(0)
    let open = Atomic(0)
    /// The most connections open at once.
    let maxOpen = Atomic(0)
    /// Requests read and not yet answered, and the most at once.
    let inFlight = Atomic(0)
    let maxInFlight = Atomic(0)
    private let recorded = Mutex<[Recorded]>([])
    private let channels = Mutex<[ObjectIdentifier: any Channel]>([:])
    var port: Int { channel.localAddress?.port ?? 0 }
    var url: String { "http://127.0.0.1:\(port)" }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup) {
        self.channel = channel
        self.group = group
    }

    static func start() async throws -> RecordingProvider {
        let holder = Holder()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Connection(holder: holder))
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        let provider = RecordingProvider(channel: channel, group: group)
        holder.provider.withLock { $0 = provider }
        return provider
    }

    func stop() {
        let group = self.group
        channel.close().whenComplete { _ in group.shutdownGracefully { _ in } }
    }

    static func raise(_ maximum: borrowing Atomic<Int>, to value: Int) {
        var seen = maximum.load(ordering: .relaxed)
        while value > seen {
            let (exchanged, original) = maximum.compareExchange(expected: seen, desired: value, ordering: .relaxed)
            if exchanged { break }
            seen = original
        }
    }

    var requests: [Recorded] { recorded.withLock { $0 } }
    var requestLines: [String] { requests.map(\.line) }

    /// Resets every open connection (RST, as a provider that drops idle connections may).
    func resetConnections() async throws {
        for channel in channels.withLock({ Array($0.values) }) {
            if let provider = channel as? any SocketOptionProvider {
                try? await provider.setSoLinger(linger(l_onoff: 1, l_linger: 0)).get()
            }
            try? await channel.close()
        }
    }

    final class Holder: Sendable {
        let provider = Mutex<RecordingProvider?>(nil)
        func with(_ body: (RecordingProvider) -> Void) {
            if let provider = provider.withLock({ $0 }) { body(provider) }
        }
    }

    final class Connection: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let holder: Holder
        var received: [UInt8] = []

        init(holder: Holder) {
            self.holder = holder
        }

        func channelActive(context: ChannelHandlerContext) {
            let channel = context.channel
            holder.with { provider in
                provider.accepted.add(1, ordering: .relaxed)
                RecordingProvider.raise(provider.maxOpen, to: provider.open.add(1, ordering: .relaxed).newValue)
                provider.channels.withLock { $0[ObjectIdentifier(channel)] = channel }
            }
            context.fireChannelActive()
        }

        func channelInactive(context: ChannelHandlerContext) {
            let channel = context.channel
            holder.with { provider in
                provider.open.subtract(1, ordering: .relaxed)
                _ = provider.channels.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
            }
            context.fireChannelInactive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += Array(buffer: unwrapInboundIn(data))
            while let request = nextRequest() {
                holder.with { provider in
                    provider.recorded.withLock { $0.append(request) }
                    RecordingProvider.raise(provider.maxInFlight, to: provider.inFlight.add(1, ordering: .relaxed).newValue)
                }
                answer(request, context: context)
            }
        }

        /// The next whole request in `received`, framed as a server frames it.
        func nextRequest() -> Recorded? {
            let end: [UInt8] = Array("\r\n\r\n".utf8)
            guard received.count >= 4, let at = (0...(received.count - 4)).first(where: { Array(received[$0..<$0 + 4]) == end })
            else { return nil }
            let head = String(decoding: received[..<at], as: UTF8.self)
            var lines = head.components(separatedBy: "\r\n")
            let requestLine = lines.removeFirst().split(separator: " ")
            var headers: [String: String] = [:]
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { continue }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                headers[name] = headers[name].map { $0 + ", " + value } ?? value
            }
            let length = headers["content-length"].flatMap { Int($0) } ?? 0
            guard received.count >= at + 4 + length else { return nil }
            let body = String(decoding: received[(at + 4)..<(at + 4 + length)], as: UTF8.self)
            received.removeFirst(at + 4 + length)
            let line = requestLine.count >= 2 ? "\(requestLine[0]) \(requestLine[1])" : head
            return Recorded(line: line, headers: headers, body: body)
        }

        func answer(_ request: Recorded, context: ChannelHandlerContext) {
            let target = request.line.split(separator: " ").last.map(String.init) ?? "/"
            let path = target.split(separator: "?").first.map(String.init) ?? target
            let loop = context.eventLoop.assumeIsolated()
            if request.line.hasPrefix("TRACE ") {
                // Reflects the request as a TRACE answer does, credentials included.
                let echo = request.line + "\r\n" + request.headers.map { "\($0.key): \($0.value)" }.joined(separator: "\r\n")
                holder.with { $0.inFlight.subtract(1, ordering: .relaxed) }
                write(
                    "HTTP/1.1 200 OK\r\ncontent-type: message/http\r\ncontent-length: \(echo.utf8.count)\r\n\r\n" + echo, context: context)
                return
            }
            switch path.split(separator: "/").last.map(String.init) ?? "" {
            case "close-on-read":
                holder.with { $0.inFlight.subtract(1, ordering: .relaxed) }
                context.close(promise: nil)
            case "stall":
                write("HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n0123456789", context: context)
            case "slow":
                loop.scheduleTask(in: .milliseconds(300)) { self.write(Self.response(), context: context) }
            case "idle-bytes":
                write(Self.response(), context: context)
                loop.scheduleTask(in: .milliseconds(100)) {
                    self.write("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale", context: context)
                }
            case "headers":
                write(
                    Self.response(extra: [
                        "connection: keep-alive, x-secret-thing", "x-secret-thing: hop", "x-kept: end-to-end",
                        "anthropic-organization-id: org-secret", "anthropic-organization-name: Provider Account",
                        "anthropic-ratelimit-requests-limit: 4000", "anthropic-ratelimit-tokens-remaining: 399000",
                        "x-ratelimit-limit-requests: 4000", "X-RateLimit-Reset: 2", "set-cookie: session=provider; HttpOnly",
                        "Set-Cookie: other=1",
                    ]),
                    context: context)
            default:
                write(Self.response(), context: context)
            }
        }

        static func response(extra: [String] = []) -> String {
            let body = #"{"id":"msg_rec","type":"message","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":4}}"#
            let fields = ["content-type: application/json", "content-length: \(body.utf8.count)"] + extra
            return "HTTP/1.1 200 OK\r\n" + fields.joined(separator: "\r\n") + "\r\n\r\n" + body
        }

        func write(_ text: String, context: ChannelHandlerContext) {
            if text.hasPrefix("HTTP/1.1 200 OK\r\ncontent-type") { holder.with { $0.inFlight.subtract(1, ordering: .relaxed) } }
            guard context.channel.isActive else { return }
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: text)), promise: nil)
        }
    }
}
