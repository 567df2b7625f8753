import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// A provider speaking raw HTTP/1.1 bytes, so tests can send what a real server may send and an
/// HTTP library would not (no length, early close, a stall mid-body), and count connections.
///
/// The request path chooses the answer:
/// - `/keep`: 200, `content-length`, keep-alive; `HEAD /keep` gets the same head and no body.
/// - `/drop-idle`: like `/keep`, then the connection is closed 100 ms later.
/// - `/close`: 200 with `connection: close`, then the connection is closed.
/// - `/chunked`: 200, three chunks.
/// - `/eof`: 200 without length or chunking; the body ends when the connection closes.
/// - `/slow-head`: the head after 5 s.
/// - `/stall`: a head declaring 1 MB, 10 bytes, then silence.
/// - `POST /early`: 413 (keep-alive) as soon as the head arrived; the body is never read.
/// - `/big`: 4 MB with `content-length`, written in 64 KiB pieces; `/huge`: 64 MB the same way.
/// - Through the gateway (`/v1/keep`, …) the `/v1` prefix is ignored.
final class ScriptedProvider: Sendable {
    let channel: any Channel
    let accepted = Atomic(0)
    let open = Atomic(0)
    var port: Int { channel.localAddress?.port ?? 0 }

    private init(channel: any Channel) {
        self.channel = channel
    }

    static func start() async throws -> ScriptedProvider {
        let counters = Counters()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Connection(counters: counters))
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        let provider = ScriptedProvider(channel: channel)
        counters.provider.withLock { $0 = provider }
        return provider
    }

    func stop() {
        channel.close(promise: nil)
    }

    /// Lets connections reach the provider's counters, which exist only after the bind.
    final class Counters: Sendable {
        let provider = Mutex<ScriptedProvider?>(nil)
        func update(_ body: (ScriptedProvider) -> Void) {
            if let provider = provider.withLock({ $0 }) { body(provider) }
        }
    }

    final class Connection: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let counters: Counters
        var received = ByteBuffer()
        /// Answered early: the rest of the request is never read.
        var stoppedReading = false

        init(counters: Counters) {
            self.counters = counters
        }

        func channelActive(context: ChannelHandlerContext) {
            counters.update {
                $0.accepted.add(1, ordering: .relaxed)
                $0.open.add(1, ordering: .relaxed)
            }
            context.fireChannelActive()
        }

        func channelInactive(context: ChannelHandlerContext) {
            counters.update { $0.open.subtract(1, ordering: .relaxed) }
            context.fireChannelInactive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var chunk = unwrapInboundIn(data)
            if stoppedReading { return }
            received.writeBuffer(&chunk)
            if String(buffer: received).hasPrefix("POST /early "), String(buffer: received).contains("\r\n\r\n") {
                stoppedReading = true
                context.channel.setOption(ChannelOptions.autoRead, value: false).whenComplete { _ in }
                let answer = "HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo long"
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: answer)), promise: nil)
                return
            }
            while let (method, path) = takeRequest() {
                answer(method: method, path: path, context: context)
            }
        }

        /// The method and path of the next complete request (head and declared body), if it arrived.
        func takeRequest() -> (String, String)? {
            let text = String(buffer: received)
            guard let end = text.range(of: "\r\n\r\n") else { return nil }
            let head = text[..<end.lowerBound]
            let length =
                head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            let total = text.utf8.distance(from: text.startIndex, to: end.upperBound) + length
            guard received.readableBytes >= total else { return nil }
            received.moveReaderIndex(forwardBy: total)
            received.discardReadBytes()
            let words = head.split(separator: " ", maxSplits: 2)
            return (String(words[0]), String(words[1]))
        }

        func answer(method: String, path: String, context: ChannelHandlerContext) {
            let loop = context.eventLoop.assumeIsolated()
            func send(_ text: String) { context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: text)), promise: nil) }
            // Through the gateway the path keeps its `/v1` prefix.
            switch path.hasPrefix("/v1/") ? String(path.dropFirst(3)) : path {
            case "/keep":
                send("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\n" + (method == "HEAD" ? "" : "ok"))
            case "/drop-idle":
                send("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                loop.scheduleTask(in: .milliseconds(100)) { context.close(promise: nil) }
            case "/close":
                send("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 6\r\n\r\nclosed")
                context.close(promise: nil)
            case "/chunked":
                send("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n")
            case "/eof":
                send("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
                context.close(promise: nil)
            case "/slow-head":
                loop.scheduleTask(in: .seconds(5)) {
                    send("HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate")
                }
            case "/stall":
                send("HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n0123456789")
            case "/big":
                let piece = String(repeating: "x", count: 64 << 10)
                send("HTTP/1.1 200 OK\r\ncontent-length: \(64 * (64 << 10))\r\n\r\n")
                for _ in 0..<64 { send(piece) }
            case "/huge":
                let piece = String(repeating: "x", count: 64 << 10)
                send("HTTP/1.1 200 OK\r\ncontent-length: \(1024 * (64 << 10))\r\n\r\n")
                for _ in 0..<1024 { send(piece) }
            default:
                send("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            }
        }
    }
}
