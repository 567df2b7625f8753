import HTTPTypes
import NIOCore

extension ProxyHandler {
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
    /// hop-by-hop, not named by its `Connection` header, and not the provider account's
    /// organisation (`anthropic-organization-id` and any other `anthropic-organization-*`).
    static func forwardsResponseHeader(_ name: String, connectionOptions: Set<String>) -> Bool {
        !droppedResponseHeaders.contains(name) && !name.hasPrefix("anthropic-organization-") && !connectionOptions.contains(name)
    }

    /// Refuses, before anything is charged, a request the upstream client cannot frame: a TRACE
    /// with a body (its body would reach the provider as a second request) and CONNECT. Meant to
    /// be called before admission; the client refuses the same requests
    /// (``UpstreamError/notFramable(_:)``) in any case, sending nothing.
    static func checkFraming(method: HTTPRequest.Method, bodyLength: Int) throws {
        if method == .connect {
            throw GatewayError.invalidRequest("CONNECT is not forwarded to the provider.")
        }
        if method == .trace, bodyLength > 0 {
            throw GatewayError.invalidRequest("A TRACE request cannot carry a body; send it without one.")
        }
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (optional whitespace in a field list).
    fileprivate var trimmingSpaces: Substring {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text.removeFirst() }
        while let last = text.last, last == " " || last == "\t" { text.removeLast() }
        return text
    }
}
