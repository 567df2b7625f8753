import HTTPTypes
import Hummingbird
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
    /// hop-by-hop, not named by its `Connection` header, and nothing about the operator's whole
    /// provider account (``isAccountWideResponseField(_:)``).
    static func forwardsResponseHeader(_ name: String, connectionOptions: Set<String>) -> Bool {
        !droppedResponseHeaders.contains(name) && !isAccountWideResponseField(name) && !connectionOptions.contains(name)
    }

    /// Refuses, from the head alone and before a byte of the body is read, what the provider
    /// would read differently from CapGate (SPEC §2, in the order 405 then 415): `TRACE` (its
    /// echo would show the provider key) and `CONNECT` on any path, and a request body in any
    /// `Content-Encoding` but `identity` (CapGate would count compressed bytes the provider reads
    /// decompressed).
    static func checkHead(_ request: Request) throws {
        if request.method == .trace || request.method == .connect {
            throw methodRefusal(request.method)
        }
        // Readers disagree on which of several Content-Type fields counts (the first, the last,
        // both joined): one decides whether CapGate reads the body, so it must be one.
        if request.headers[values: .contentType].count > 1 {
            throw GatewayError.invalidRequest("The request has more than one Content-Type field; send one.")
        }
        for value in request.headers[values: .contentEncoding] {
            for coding in value.split(separator: ",") where !coding.trimmingSpaces.isEmpty {
                guard coding.trimmingSpaces.lowercased() == "identity" else {
                    throw GatewayError(
                        .unsupportedMediaType, "invalid_request_error",
                        "Content-Encoding '\(coding.trimmingSpaces.prefix(40))' is not accepted: send the request body uncompressed."
                    )
                }
            }
        }
    }

    /// The 405 of `TRACE` and `CONNECT`, with the methods a forwarded path takes in `Allow`.
    static func methodRefusal(_ method: HTTPRequest.Method) -> GatewayError {
        GatewayError(
            .methodNotAllowed, "invalid_request_error", "\(method.rawValue) is not allowed through the gateway.",
            headers: [.allow: "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"])
    }

    /// Whether a field of the provider's answer (lowercased name) describes the operator's whole
    /// provider account (SPEC §2): rate limits and organisation fields, and cookies.
    static func isAccountWideResponseField(_ name: String) -> Bool {
        name.hasPrefix("anthropic-organization-") || name.hasPrefix("anthropic-ratelimit-") || name.hasPrefix("x-ratelimit-")
            || name == "set-cookie"
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
