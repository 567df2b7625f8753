import CapGate
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// The mock provider's Messages API on plain SwiftNIO channel handlers, for the benchmark
/// harness (`capgate mock --lean`): the same answers as ``MockProvider`` for `POST …/messages`
/// (a message, or with `"stream": true` its SSE events) and `GET /v1/models`, without the test
/// controls, the echo, or Hummingbird's per-request tasks.
///
/// Why: the harness runs the provider on the same two cores as CapGate, PostgreSQL and wrk, so
/// its CPU per call is taken from CapGate's share. ``MockProvider`` costs ≈ 90 µs of CPU a call at
/// 4,000 calls/s; the provider the performance issue was measured against answered ≈ 117,000
/// requests/s on this machine. A real provider runs elsewhere.
public enum LeanMockProvider {
    /// Serves on `host:port` until the returned channel is closed.
    public static func bind(host: String, port: Int, group: any EventLoopGroup) async throws -> any Channel {
        try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(Handler())
                }
            }
            .bind(host: host, port: port)
            .get()
    }

    /// Runs on `host:port` until SIGINT or SIGTERM ends the process (a mock has nothing to drain).
    ///
    /// The signals keep their default action, restored here: a child inherits an ignored SIGTERM
    /// from a parent that ignores it (as ServiceLifecycle does), and a signal mask from the thread
    /// that spawned it (a Dispatch worker blocks nearly every signal). The main thread unblocks
    /// them, so a SIGTERM sent to the process always finds a thread that takes it. Catching them
    /// with Dispatch signal sources instead left the mock running after a SIGTERM about one run in
    /// four under the test suite.
    public static func run(host: String, port: Int, logger: Logger) async throws {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.main.async {
                restoreStopSignals()
                done.resume()
            }
        }
        restoreStopSignals()
        let channel = try await bind(host: host, port: port, group: MultiThreadedEventLoopGroup.singleton)
        logger.info("lean mock provider", metadata: ["address": "\(channel.localAddress.map(String.init(describing:)) ?? "")"])
        try await channel.closeFuture.get()
    }

    /// SIGINT and SIGTERM: default action, unblocked on the calling thread.
    static func restoreStopSignals() {
        var stops = sigset_t()
        sigemptyset(&stops)
        for signalNumber in [SIGINT, SIGTERM] {
            signal(signalNumber, SIG_DFL)
            sigaddset(&stops, signalNumber)
        }
        pthread_sigmask(SIG_UNBLOCK, &stops, nil)
    }

    final class Handler: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart

        private var head: HTTPRequestHead?
        private var body: ByteBuffer?
        private var count = 0

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                self.head = head
                body = nil
            case .body(var chunk):
                if body == nil { body = chunk } else { body!.writeBuffer(&chunk) }
            case .end:
                guard let head else { return }
                self.head = nil
                count += 1
                respond(to: head, body: body ?? ByteBuffer(), context: context)
            }
        }

        private func respond(to head: HTTPRequestHead, body: ByteBuffer, context: ChannelHandlerContext) {
            let path = head.uri.split(separator: "?", maxSplits: 1).first ?? ""
            let keepAlive = head.isKeepAlive
            if head.method == .POST, path.hasSuffix("/messages") {
                let fields = JSON.topLevelValues(["model", "stream"], in: body)
                let model = fields["model"]?.stringValue ?? "claude-mock-1"
                // The body is not parsed here (this provider is the benchmark's): input from its size.
                let usage = MockUsage(input: Int64(max(1, body.readableBytes / 4)), output: MockProvider.outputTokens)
                if fields["stream"]?.boolValue == true {
                    stream(MockProvider.streamEvents(model: model, usage: usage), keepAlive: keepAlive, context: context)
                } else {
                    let message = MockProvider.message(id: "msg_mock_" + String(count, radix: 16), model: model, usage: usage)
                    write(.ok, contentType: "application/json", body: message.byteBuffer(), keepAlive: keepAlive, context: context)
                }
            } else if head.method == .GET, path == "/v1/models" {
                write(.ok, contentType: "application/json", body: MockProvider.models.byteBuffer(), keepAlive: keepAlive, context: context)
            } else {
                let error = JSON.obj(["type": "error", "error": .obj(["type": "not_found_error", "message": "not in the lean mock"])])
                write(.notFound, contentType: "application/json", body: error.byteBuffer(), keepAlive: keepAlive, context: context)
            }
        }

        /// Server-sent events, chunked (no length, as the provider streams), one flush each.
        private func stream(_ events: [(event: String, data: JSON)], keepAlive: Bool, context: ChannelHandlerContext) {
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: "text/event-stream")
            headers.add(name: "cache-control", value: "no-cache")
            headers.add(name: "transfer-encoding", value: "chunked")
            if !keepAlive { headers.add(name: "connection", value: "close") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            for (event, data) in events {
                let text = ByteBuffer(string: "event: \(event)\ndata: \(data.serialized())\n\n")
                context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(text))), promise: nil)
            }
            end(keepAlive: keepAlive, context: context)
        }

        private func end(keepAlive: Bool, context: ChannelHandlerContext) {
            if keepAlive {
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            } else {
                context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { [channel = context.channel] _ in
                    channel.close(promise: nil)
                }
            }
        }

        /// Head and body in one write and one flush.
        private func write(
            _ status: HTTPResponseStatus, contentType: String, body: ByteBuffer, keepAlive: Bool, context: ChannelHandlerContext
        ) {
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: contentType)
            headers.add(name: "content-length", value: String(body.readableBytes))
            headers.add(name: "request-id", value: "mock_req")
            if !keepAlive { headers.add(name: "connection", value: "close") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            end(keepAlive: keepAlive, context: context)
        }
    }
}
