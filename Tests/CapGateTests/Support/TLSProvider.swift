import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

@testable import CapGate
@testable import CapGateDev

/// An `https` provider on 127.0.0.1 (NIOSSL with a certificate from ``TestPKI``), speaking
/// HTTP/1.1 like the Anthropic API:
/// - `POST /v1/messages`: the mock provider's message as JSON with `content-length`, or with
///   `"stream": true` its server-sent events, each event written and flushed on its own, 5 ms apart,
///   chunked;
/// - `POST /hooks/…`: a webhook receiver; the POST is recorded and answered 204.
/// It records the SNI host name of every TLS handshake.
final class TLSProvider: Sendable {
    struct Hook: Sendable {
        var headers: HTTPHeaders
        var body: String
    }

    final class Record: Sendable {
        /// The SNI host name of each handshake (nil: the client sent none).
        let serverNames = Mutex<[String?]>([])
        /// Messages answered 200.
        let served = Atomic(0)
        let hooks = Mutex<[Hook]>([])
    }

    let channel: any Channel
    let record: Record
    var port: Int { channel.localAddress?.port ?? 0 }
    var serverNames: [String?] { record.serverNames.withLock { $0 } }
    var served: Int { record.served.load(ordering: .relaxed) }
    var hooks: [Hook] { record.hooks.withLock { $0 } }

    private init(channel: any Channel, record: Record) {
        self.channel = channel
        self.record = record
    }

    static func start(serving issued: TestPKI.Issued) async throws -> TLSProvider {
        let record = Record()
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try issued.nioCertificate)], privateKey: .privateKey(try issued.nioKey))
        configuration.applicationProtocols = ["http/1.1"]
        // Called with the client hello's extensions: where the SNI host name is read.
        configuration.sslContextCallback = { values, promise in
            record.serverNames.withLock { $0.append(values.serverHostname) }
            promise.succeed(.noChanges)
        }
        let context = try NIOSSLContext(configuration: configuration)
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLServerHandler(context: context))
                    try sync.configureHTTPServerPipeline(withErrorHandling: true)
                    try sync.addHandler(Responder(record: record))
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        return TLSProvider(channel: channel, record: record)
    }

    func stop() {
        channel.close(promise: nil)
    }

    /// The whole answer to a message call.
    static let message = MockProvider.message(
        id: "msg_tls_1", model: "claude-test", usage: MockUsage(input: 5, output: MockProvider.outputTokens))
    /// The streamed answer's events, each one as written.
    static let events: [String] = MockProvider.streamEvents(
        model: "claude-test", usage: MockUsage(input: 5, output: MockProvider.outputTokens)
    ).map {
        "event: \($0.event)\ndata: \($0.data.serialized())\n\n"
    }

    final class Responder: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart

        let record: Record
        var head: HTTPRequestHead?
        var body = ByteBuffer()

        init(record: Record) {
            self.record = record
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                self.head = head
                body.clear()
            case .body(var chunk):
                body.writeBuffer(&chunk)
            case .end:
                guard let head else { return }
                answer(head, context: context)
            }
        }

        func answer(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
            if head.uri.hasPrefix("/hooks/") {
                record.hooks.withLock { $0.append(Hook(headers: head.headers, body: String(buffer: body))) }
                send(status: .noContent, contentType: nil, body: "", context: context)
                return
            }
            guard head.method == .POST, head.uri == "/v1/messages" else {
                send(status: .notFound, contentType: "application/json", body: "{}", context: context)
                return
            }
            record.served.add(1, ordering: .relaxed)
            let stream = JSON.topLevelValues(["stream"], in: body)["stream"]?.boolValue == true
            guard stream else {
                send(status: .ok, contentType: "application/json", body: TLSProvider.message.serialized(), context: context)
                return
            }
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: "text/event-stream")
            headers.add(name: "transfer-encoding", value: "chunked")
            context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            let loop = context.eventLoop.assumeIsolated()
            for (index, event) in TLSProvider.events.enumerated() {
                loop.scheduleTask(in: .milliseconds(Int64(5 * (index + 1)))) {
                    context.writeAndFlush(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: event)))), promise: nil)
                }
            }
            loop.scheduleTask(in: .milliseconds(Int64(5 * (TLSProvider.events.count + 1)))) {
                context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            }
        }

        func send(status: HTTPResponseStatus, contentType: String?, body: String, context: ChannelHandlerContext) {
            var headers = HTTPHeaders()
            if let contentType { headers.add(name: "content-type", value: contentType) }
            headers.add(name: "content-length", value: String(body.utf8.count))
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            if !body.isEmpty { context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil) }
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }
}
