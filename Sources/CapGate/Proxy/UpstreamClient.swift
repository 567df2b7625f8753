import AsyncHTTPClient
import Foundation
import NIOCore
import NIOPosix

/// CapGate's own HTTP client for the provider: redirects disallowed, decompression off (bodies
/// pass through byte for byte), no retried connection attempts (an unreachable provider is a
/// fast 502, not a wait), and a connection pool wide enough for a gateway.
public struct UpstreamClient: Sendable {
    public let http: HTTPClient
    public let baseURL: String
    public let apiKey: String?
    public let headTimeout: TimeAmount

    public init(configuration: CapGateConfiguration, baseURL: String, eventLoopGroup: any EventLoopGroup) {
        var pool = HTTPClient.Configuration.ConnectionPool(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 512)
        pool.retryConnectionEstablishment = false
        var config = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(
                connect: .milliseconds(Int64(configuration.upstreamConnectTimeout * 1000)),
                read: .milliseconds(Int64(configuration.upstreamIdleTimeout * 1000))
            ),
            connectionPool: pool,
            decompression: .disabled
        )
        config.httpVersion = .automatic
        self.http = HTTPClient(eventLoopGroup: eventLoopGroup, configuration: config)
        self.baseURL = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        self.apiKey = configuration.upstreamAPIKey
        self.headTimeout = .milliseconds(Int64(configuration.upstreamTimeout * 1000))
    }

    public func shutdown() async throws {
        try await http.shutdown()
    }
}
