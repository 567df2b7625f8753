/// The metrics and log label of a forwarded call: one of a small fixed set of the provider's
/// routes, else `proxied`. Never the raw path, so clients cannot grow the number of metric
/// series by sending new paths (SPEC §7).
enum ProviderRoutes {
    /// The label of every forwarded path that matches none of ``patterns``.
    static let other = "proxied"
    /// The label of a request no route matched (CapGate's own or the provider's).
    static let unmatched = "unmatched"

    /// Known provider routes; `{id}` matches any one segment.
    static let patterns: [String] = [
        "/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches", "/v1/messages/batches/{id}",
        "/v1/messages/batches/{id}/results", "/v1/messages/batches/{id}/cancel", "/v1/models", "/v1/models/{id}",
        "/v1/complete", "/v1/files", "/v1/files/{id}", "/v1/files/{id}/content",
    ]

    private static let split: [(label: String, segments: [Substring?])] = patterns.map { pattern in
        (pattern, pattern.split(separator: "/").map { $0.hasPrefix("{") ? nil : $0 })
    }

    /// The label of a forwarded call to `path` (resolved, without the query).
    static func label(for path: String) -> String {
        let segments = path.split(separator: "/")
        guard segments.count <= 5 else { return other }
        for (label, pattern) in split where pattern.count == segments.count {
            if zip(pattern, segments).allSatisfy({ $0.0 == nil || $0.0 == $0.1 }) { return label }
        }
        return other
    }
}
