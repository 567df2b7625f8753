import Foundation

/// Which header fields cross the gateway: hop-by-hop fields (also those a `Connection` header
/// names), the client's credentials and the fields it must not steer never go to the provider;
/// hop-by-hop fields and everything about the operator's whole provider account never come back.
enum ForwardedFields {
    /// Headers never forwarded upstream: hop-by-hop fields, the client's credentials, and the
    /// ones the client must not steer.
    static let droppedRequestHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authorization",
        "proxy-authenticate", "proxy-connection", "host", "content-length", "x-api-key", "authorization",
        "accept-encoding", "expect", "x-capgate-company", "x-company-id", "cookie", "capgate-feature",
        // Method overrides: the provider must run the method CapGate matched and charged.
        "x-http-method-override", "x-http-method", "x-method-override",
        // A reverse proxy's notes on the end user (their address, the names they used): the
        // provider has no use for them, and CapGate reads none of them.
        "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "forwarded", "x-real-ip", "via",
    ]
    /// Headers of the provider's answer not passed back (also those its `Connection` header
    /// names, and every `anthropic-organization-*`: see ``forwardsResponseHeader(_:connectionOptions:)``).
    static let droppedResponseHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authenticate",
        "proxy-connection", "content-length", "request-id", "ratelimit", "ratelimit-policy", "anthropic-organization-id",
    ]

    /// The field names a `Connection` header lists (RFC 9110 §7.6.1: they are hop-by-hop and
    /// must not be forwarded), lowercased; `close` and `keep-alive` come along, harmlessly.
    static func connectionOptions(_ values: [String]) -> Set<String> {
        guard !values.isEmpty else { return [] }
        var names: Set<String> = []
        for value in values {
            for part in value.split(separator: ",") {
                let name = part.trimmingSpaces.lowercased()
                if !name.isEmpty { names.insert(name) }
            }
        }
        return names
    }

    /// Whether a field of the client's request (canonical, lowercased name) goes to the provider.
    static func forwardsRequestHeader(_ name: String, connectionOptions: Set<String>) -> Bool {
        !droppedRequestHeaders.contains(name) && !connectionOptions.contains(name)
    }

    /// Whether a field of the provider's answer (lowercased name) goes back to the tenant: not
    /// hop-by-hop, not named by its `Connection` header, and nothing about the operator's whole
    /// provider account (``isAccountWideResponseField(_:)``).
    static func forwardsResponseHeader(_ name: String, connectionOptions: Set<String>) -> Bool {
        !droppedResponseHeaders.contains(name) && !isAccountWideResponseField(name) && !connectionOptions.contains(name)
    }

    /// Whether a field of the provider's answer (lowercased name) describes the operator's whole
    /// provider account (SPEC §2): rate limits and organisation fields, and cookies.
    static func isAccountWideResponseField(_ name: String) -> Bool {
        name.hasPrefix("anthropic-organization-") || name.hasPrefix("anthropic-ratelimit-") || name.hasPrefix("x-ratelimit-")
            || name == "set-cookie"
    }
}
