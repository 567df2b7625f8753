import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// HTTP/1.1 clients for webhook receivers, one per origin (scheme, host, port), made on first
/// use: the project's own ``UpstreamClient`` (strict framing, timeouts, TLS for `https`), with
/// the notification timeout for connecting, the head and the body, and the trust roots of
/// `notifications.caFile` (or the system's) for `https` receivers. The provider's key is never
/// sent: ``UpstreamClient`` adds no credential by itself.
final class WebhookClients: Sendable {
    let configuration: CapGateConfiguration
    let trust: UpstreamTrust
    private let clients = Mutex<[String: UpstreamClient]>([:])

    /// Throws ``ConfigurationError`` when `notifications.caFile` holds no readable certificate.
    init(configuration: CapGateConfiguration, timeout: Double) throws {
        self.trust = try UpstreamTrust(file: configuration.notifications.caFile, key: "notifications.caFile")
        var settings = configuration
        settings.upstream.timeout = timeout
        settings.upstream.connectTimeout = timeout
        settings.upstream.idleTimeout = timeout
        settings.upstream.maxConnections = 16
        settings.upstream.apiKey = nil
        self.configuration = settings
    }

    /// POSTs `body` to `url`; returns the answer's status once its body was read (at most 1 MiB
    /// of it, and no longer than `timeout` after the POST began: a receiver that drips its body
    /// cannot hold the attempt open; its answer means nothing but its status).
    func post(url: String, headers: HTTPHeaders, body: ByteBuffer) async throws -> Int {
        let deadline = ContinuousClock.now + .milliseconds(Int64(configuration.upstream.timeout * 1000))
        guard let parsed = URL(string: url), let scheme = parsed.scheme, let host = parsed.host else {
            throw WebhookURLError(url: url)
        }
        let hostLiteral = host.contains(":") ? "[\(host)]" : host
        let origin = "\(scheme.lowercased())://\(hostLiteral)" + (parsed.port.map { ":\($0)" } ?? "")
        var target = parsed.path(percentEncoded: true)
        if target.isEmpty { target = "/" }
        if let query = parsed.query(percentEncoded: true) { target += "?" + query }
        let client = try self.client(for: origin)
        let response = try await client.execute(method: .POST, target: target, headers: headers, body: body)
        if case .stream(let stream) = response.body {
            var read = 0
            for try await chunk in stream {
                read += chunk.readableBytes
                if read > 1 << 20 || ContinuousClock.now > deadline { break }
            }
        }
        return Int(response.head.status.code)
    }

    private func client(for origin: String) throws -> UpstreamClient {
        try clients.withLock { clients in
            if let existing = clients[origin] { return existing }
            let made = try UpstreamClient(
                configuration: configuration, baseURL: origin, eventLoopGroup: MultiThreadedEventLoopGroup.singleton, trust: trust)
            clients[origin] = made
            return made
        }
    }

    func shutdown() async {
        let all = clients.withLock { clients in
            defer { clients = [:] }
            return Array(clients.values)
        }
        for client in all { try? await client.shutdown() }
    }
}

struct WebhookURLError: Error, CustomStringConvertible {
    var url: String
    var description: String { "not an absolute http(s) URL" }
}
