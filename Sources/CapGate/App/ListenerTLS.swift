import Foundation
import Logging
import NIOSSL
import ServiceLifecycle
import Synchronization
import UnixSignals

/// The listener's TLS identity, kept where every new connection finds it and replaced whole on
/// SIGHUP.
///
/// A certificate is renewed while the gateway runs (Let's Encrypt every 60 days): restarting
/// would cut every stream in flight. Each new connection's `NIOSSLServerHandler` takes the
/// context current when the connection is accepted, and a connection keeps the context it started
/// with (its `SSL` object holds it), so a reload touches no open connection. A reload whose files
/// are bad (half-written, a key that is not the certificate's) keeps the identity being served and
/// logs why at error level: the gateway never ends up serving nothing.
public final class ListenerTLS: Sendable {
    let files: ListenerTLSFiles
    private let identity: Mutex<ListenerIdentity>

    /// Reads and checks the files; throws ``ConfigurationError`` naming the bad one.
    public init(files: ListenerTLSFiles) throws {
        self.files = files
        self.identity = Mutex(try ListenerIdentity.load(files))
    }

    /// The context a connection accepted now uses for its handshake.
    var context: NIOSSLContext { identity.withLock { $0.context } }

    /// The certificate being served: its serial number (hex) and the end of its validity.
    public var served: (serial: String, notAfter: Date) { identity.withLock { ($0.serial, $0.notAfter) } }

    /// The served certificate's facts, as the logs give them.
    var servedMetadata: Logger.Metadata { identity.withLock { Self.metadata($0) } }

    /// Reads the files again; on success new connections get the new identity, on failure the
    /// current one stays. Returns whether it changed. The log names the files and the problem,
    /// never the key's content. The two files are a few kilobytes, read on the signal's task
    /// (well under a millisecond), so it needs no thread of its own.
    @discardableResult
    public func reload(logger: Logger) -> Bool {
        do {
            let fresh = try ListenerIdentity.load(files)
            identity.withLock { $0 = fresh }
            logger.notice("TLS certificate reloaded", metadata: Self.metadata(fresh))
            return true
        } catch {
            let kept = identity.withLock { $0 }
            var metadata = Self.metadata(kept)
            metadata["error"] = "\(error)"
            logger.error("TLS certificate not reloaded; still serving the previous one", metadata: metadata)
            return false
        }
    }

    /// What the logs say of an identity (public facts of the certificate only).
    static func metadata(_ identity: ListenerIdentity) -> Logger.Metadata {
        [
            "serial": "\(identity.serial)", "subject": "\(identity.subject)",
            "not_after": "\(identity.notAfter.formatted(.iso8601))",
        ]
    }
}

/// Re-reads the listener's certificate and key on each SIGHUP (`systemctl reload`, or
/// `kill -HUP` after a renewal), until the gateway shuts down.
///
/// It runs in every gateway, with HTTPS or without: SIGHUP's default action ends the process at
/// once, in-flight calls and all, and a service manager's reload (the systemd unit's
/// `ExecReload=`) must never do that. Without `http.tls.*` a SIGHUP is logged and nothing else.
/// The handler is installed before the server listens (``make(tls:logger:)`` awaits it): a
/// SIGHUP that arrived between the start and its installation would end the process.
struct ListenerTLSReloader: Service {
    let tls: ListenerTLS?
    let signals: UnixSignalsSequence
    let logger: Logger

    static func make(tls: ListenerTLS?, logger: Logger) async -> ListenerTLSReloader {
        ListenerTLSReloader(tls: tls, signals: await UnixSignalsSequence(trapping: .sighup), logger: logger)
    }

    func run() async {
        for await _ in signals.cancelOnGracefulShutdown() {
            guard let tls else {
                logger.notice("SIGHUP: nothing to reload (http.tls.certificate and http.tls.key are not set)")
                continue
            }
            tls.reload(logger: logger)
        }
    }
}
