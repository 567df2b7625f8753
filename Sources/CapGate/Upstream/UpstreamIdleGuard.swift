import NIOCore

/// Sits in front of the HTTP decoder (behind TLS, so it sees the provider's HTTP bytes only):
/// a provider that sends anything while its connection has no request in flight can no longer be
/// trusted to frame the next answer (it could be a stale or smuggled response), so the connection
/// is closed, which takes it out of the pool, and the bytes are dropped.
final class UpstreamIdleGuard: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let connection: UpstreamConnection

    init(connection: UpstreamConnection) {
        self.connection = connection
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if connection.isIdle {
            connection.close()
            return
        }
        context.fireChannelRead(data)
    }
}
