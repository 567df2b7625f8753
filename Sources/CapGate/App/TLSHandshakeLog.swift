import Logging
import NIOCore
import NIOSSL
import NIOTLS

/// Sits behind the listener's TLS handler until the handshake completes, and logs a failed
/// handshake at debug level with the client's address and NIOSSL's reason.
///
/// A failed handshake is the client's doing (plain HTTP sent to the HTTPS port, a scanner, a
/// client that does not trust the certificate): NIOSSL closes the connection, nothing was read
/// and nothing is charged. One line per such connection above debug would let anyone on the
/// network fill the log; at debug an operator can still see why clients cannot connect. The
/// error goes on down the pipeline, where Hummingbird ends the connection's task (it logs at
/// trace). Once the handshake is done the handler leaves the pipeline.
final class TLSHandshakeLog: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    let logger: Logger

    init(logger: Logger) {
        self.logger = logger
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        context.fireUserInboundEventTriggered(event)
        if case .handshakeCompleted = event as? TLSUserEvent {
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is NIOSSLError || error is BoringSSLError {
            logger.debug(
                "TLS handshake failed; connection closed",
                metadata: ["client": "\(context.channel.remoteAddress?.ipAddress ?? "unknown")", "error": "\(error)"])
        }
        context.fireErrorCaught(error)
    }
}
