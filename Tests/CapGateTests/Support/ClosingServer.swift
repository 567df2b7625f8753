import NIOCore
import NIOPosix

/// A provider that accepts a connection, reads the request and closes without answering, or
/// (``start(truncating:)``) answers 200 with a declared length, sends only part of the body and
/// then closes.
struct ClosingServer: Sendable {
    let channel: any Channel
    var port: Int { channel.localAddress?.port ?? 0 }

    final class CloseOnRead: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.close(promise: nil)
        }
    }

    final class AnswerPartly: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
            let part = ByteBuffer(string: head + "{\"id\":\"msg_cut\"")
            context.writeAndFlush(wrapOutboundOut(part)).whenComplete { _ in context.close(promise: nil) }
        }
    }

    static func start(truncating: Bool = false) async throws -> ClosingServer {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if truncating {
                        try channel.pipeline.syncOperations.addHandler(AnswerPartly())
                    } else {
                        try channel.pipeline.syncOperations.addHandler(CloseOnRead())
                    }
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        return ClosingServer(channel: channel)
    }

    func stop() {
        channel.close(promise: nil)
    }
}
