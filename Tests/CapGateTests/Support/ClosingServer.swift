import NIOCore
import NIOPosix

/// A provider that accepts a connection, reads the request and closes without answering.
struct ClosingServer: Sendable {
    let channel: any Channel
    var port: Int { channel.localAddress?.port ?? 0 }

    final class CloseOnRead: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.close(promise: nil)
        }
    }

    static func start() async throws -> ClosingServer {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(CloseOnRead()) }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        return ClosingServer(channel: channel)
    }

    func stop() {
        channel.close(promise: nil)
    }
}
