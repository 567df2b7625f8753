import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTPS connection to a gateway, kept open for as many requests as a test sends on it one
/// after another (HTTP/1.1 keep-alive), trusting ``TestPKI``'s CA and checking the name
/// `localhost`. It tells which certificate the gateway served on this connection, so a test can
/// see that a kept connection keeps its certificate across a reload while new ones get the new.
struct HTTPSSession {
    struct Reply: Sendable {
        var status: Int
        var body: String
    }

    /// The certificate the gateway presented in this connection's handshake.
    struct Served: Sendable, Equatable {
        /// Its serial number, upper-case hex.
        var serial: String
        /// Its end of validity, seconds since 1970.
        var notAfter: Int64
    }

    private var inbound: NIOAsyncChannelInboundStream<HTTPClientResponsePart>.AsyncIterator
    private let outbound: NIOAsyncChannelOutboundWriter<HTTPClientRequestPart>
    private let channel: any Channel

    /// Connects to 127.0.0.1:`port`, runs `body` with the session, closes the connection. With
    /// `offeringAtMost` the client offers TLS 1.0 up to that version only.
    static func with<T: Sendable>(
        port: Int, offeringAtMost newest: TLSVersion? = nil, _ body: (inout HTTPSSession) async throws -> T
    ) async throws -> T {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.trustRoots = .certificates([try TestPKI.shared.ca.nioCertificate])
        configuration.applicationProtocols = ["http/1.1"]
        if let newest {
            configuration.minimumTLSVersion = .tlsv1
            configuration.maximumTLSVersion = newest
        }
        let context = try NIOSSLContext(configuration: configuration)
        let client = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                    try sync.addHTTPClientHandlers()
                    return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(wrappingChannelSynchronously: channel)
                }
            }
        return try await client.executeThenClose { inbound, outbound in
            var session = HTTPSSession(inbound: inbound.makeAsyncIterator(), outbound: outbound, channel: client.channel)
            return try await body(&session)
        }
    }

    /// True while the connection is open.
    var isOpen: Bool { channel.isActive }

    /// The TLS version this connection speaks (known once a reply came).
    func tlsVersion() async throws -> TLSVersion? {
        try await channel.nioSSL_tlsVersion().get()
    }

    /// The certificate served on this connection (its handshake is done once a reply came).
    func served() async throws -> Served? {
        guard let certificate = try await channel.nioSSL_peerCertificate().get() else { return nil }
        return Served(
            serial: certificate.serialNumber.map { String(format: "%02X", $0) }.joined(), notAfter: Int64(certificate.notValidAfter))
    }

    /// Sends one request and reads its whole reply.
    mutating func send(_ method: HTTPMethod, _ path: String, headers: [(String, String)] = [], body: String? = nil) async throws -> Reply {
        var fields = HTTPHeaders([("host", "localhost")] + headers)
        if let body { fields.add(name: "content-length", value: String(body.utf8.count)) }
        try await outbound.write(.head(HTTPRequestHead(version: .http1_1, method: method, uri: path, headers: fields)))
        if let body { try await outbound.write(.body(.byteBuffer(ByteBuffer(string: body)))) }
        try await outbound.write(.end(nil))
        var status = 0
        var text = ""
        while let part = try await inbound.next() {
            switch part {
            case .head(let head): status = Int(head.status.code)
            case .body(let chunk): text += String(buffer: chunk)
            case .end: return Reply(status: status, body: text)
            }
        }
        throw SessionClosed()
    }

    /// A Messages API call with `key`.
    mutating func message(key: String) async throws -> Reply {
        try await send(
            .POST, "/v1/messages",
            headers: [("x-api-key", key), ("anthropic-version", "2023-06-01"), ("content-type", "application/json")],
            body: #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#)
    }

    struct SessionClosed: Error {}
}
