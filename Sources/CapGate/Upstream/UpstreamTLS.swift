import Foundation
import NIOCore
import NIOSSL
import NIOTLS

/// The roots an `https` client checks certificates against: the PEM file of a configuration key
/// (`upstream.caFile`, `notifications.caFile`), read once at start, or the system's roots.
struct UpstreamTrust: Sendable {
    var roots: NIOSSLTrustRoots
    /// Where the roots come from, as the log names it.
    var source: String

    /// The certificates in `file`, or the system's roots when it is nil. Throws
    /// ``ConfigurationError`` naming `key` when the file holds no readable PEM certificate.
    init(file: String?, key: String) throws {
        guard let file else {
            self.roots = .default
            self.source = "the system's trust roots"
            return
        }
        let certificates = (try? NIOSSLCertificate.fromPEMFile(file)) ?? []
        guard !certificates.isEmpty else {
            throw ConfigurationError(key: key, problem: "(\(file)) holds no readable PEM certificate")
        }
        self.roots = .certificates(certificates)
        self.source = "\(key) (\(file))"
    }
}

/// A TLS handshake with the provider failed; `reason` says why in words an operator can act on.
struct UpstreamTLSFailure: Error, Sendable {
    var reason: String
}

/// Sits right behind the TLS handler of a new connection until its handshake completes: a
/// handshake error is passed on as an ``UpstreamTLSFailure`` that names the problem (the
/// certificate expired, is not yet valid, was not issued by a trusted root, does not name the
/// host), so the call's 502 is logged with it. NIOSSL reports every failed chain check as the
/// same `CERTIFICATE_VERIFY_FAILED`; the dates of the certificate the provider presented tell an
/// expired one from an untrusted one. Once the handshake is done the handler leaves the pipeline.
final class UpstreamTLSDiagnosis: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    let host: String
    let trustSource: String

    init(host: String, trustSource: String) {
        self.host = host
        self.trustSource = trustSource
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        context.fireUserInboundEventTriggered(event)
        if case .handshakeCompleted = event as? TLSUserEvent {
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard error is NIOSSLError || error is NIOSSLExtraError || error is BoringSSLError else {
            context.fireErrorCaught(error)
            return
        }
        let peer = try? context.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self).peerCertificate
        let validity = peer.map {
            (
                notBefore: Date(timeIntervalSince1970: TimeInterval($0.notValidBefore)),
                notAfter: Date(timeIntervalSince1970: TimeInterval($0.notValidAfter))
            )
        }
        context.fireErrorCaught(
            UpstreamTLSFailure(reason: Self.reason(for: error, host: host, trustSource: trustSource, validity: validity, now: Date())))
    }

    /// Why the handshake failed: the problem first, then NIOSSL's own words.
    static func reason(
        for error: any Error, host: String, trustSource: String, validity: (notBefore: Date, notAfter: Date)?, now: Date
    ) -> String {
        let detail = String(describing: error)
        if let extra = error as? NIOSSLExtraError, extra == .failedToValidateHostname {
            return "certificate name mismatch: the provider's certificate is not valid for \(host) (\(detail))"
        }
        guard detail.contains("CERTIFICATE_VERIFY_FAILED") else {
            return "TLS handshake failed (\(detail))"
        }
        if let validity, validity.notAfter < now {
            return "certificate expired: the provider's certificate was valid until \(Timestamp.format(validity.notAfter)) (\(detail))"
        }
        if let validity, validity.notBefore > now {
            return "certificate not yet valid: the provider's certificate is valid from \(Timestamp.format(validity.notBefore)) (\(detail))"
        }
        return "certificate not trusted: the provider's certificate chain does not lead to a root in \(trustSource) (\(detail))"
    }
}
