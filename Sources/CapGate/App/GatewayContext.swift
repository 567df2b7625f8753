import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// The per-request context: the request id, the client's address and, once authenticated, the
/// identity.
public struct GatewayContext: RequestContext, RemoteAddressRequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The verified caller, set by ``AuthMiddleware``.
    public var identity: Identity?
    /// What the request log line reports (shared with the middleware that writes it).
    public var record: RequestRecord
    /// The TCP peer (never a forwarded header), read when the request starts: a connection that
    /// closes later forgets it. Failed operator and metrics authentications are counted by it.
    public let remoteAddress: SocketAddress?

    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.identity = nil
        self.record = RequestRecord()
        self.remoteAddress = source.channel.remoteAddress
    }

    /// Admin bodies are small; the proxy path reads its body itself with `proxy.maxBodyBytes`.
    public var maxUploadSize: Int { 1 << 20 }
}

/// A context that cannot exist without an identity: admin and usage routes use it, so the
/// compiler guarantees they never run unauthenticated.
public struct AuthenticatedContext: ChildRequestContext {
    public var coreContext: CoreRequestContextStorage
    public let identity: Identity
    public var record: RequestRecord

    public init(context: GatewayContext) throws {
        guard let identity = context.identity else {
            throw GatewayError.authentication(
                "No credential: send your CapGate API key in the x-api-key header or as Authorization: Bearer.")
        }
        self.coreContext = context.coreContext
        self.identity = identity
        self.record = context.record
    }

    public var maxUploadSize: Int { 1 << 20 }
}

/// Facts about one request gathered while it is handled, written to its single log line.
public final class RequestRecord: Sendable {
    public struct Values: Sendable {
        public var requestID = ""
        public var companyID: UUID?
        public var userID: UUID?
        public var decision: String?
        public var upstreamStatus: Int?
        public var admissionMillis: Double?
        public var upstreamMillis: Double?
        public var routeLabel: String?
    }

    let values = Mutex(Values())

    public init() {}

    public func update(_ body: (inout Values) -> Void) {
        values.withLock { body(&$0) }
    }

    public var snapshot: Values { values.withLock { $0 } }
}
