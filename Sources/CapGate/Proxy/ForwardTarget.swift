import Foundation

/// The request target CapGate decides on and forwards: the path with its dot segments resolved
/// (RFC 3986 §5.2.4, also in their percent-encoded forms `%2e`, `%2E`, `.%2e`, …), and the
/// query exactly as sent.
///
/// The decision to forward, the own-route check and the upstream request all use the resolved
/// path, so `/v1/../admin/v1/companies` can neither reach the provider as a different path
/// than the one CapGate judged nor slip past CapGate's own routes. Pure: no I/O, no state.
struct ForwardTarget: Equatable, Sendable {
    /// The path, dot segments resolved; still percent-encoded as sent.
    var path: String
    /// The query as sent (without the `?`), or nil when there was none.
    var query: String?
    /// Whether resolving changed the path.
    var changed: Bool

    /// The origin-form target: the resolved path and the original query.
    var target: String { query.map { path + "?" + $0 } ?? path }

    /// Resolves `path` (raw, as in the request line) and keeps `query`.
    ///
    /// Throws a 400 ``GatewayError`` when the dot segments climb above the root, when a dot
    /// segment carries `;` parameters (servers disagree on what `..;x` means), or when a path
    /// that was under `prefix` resolves to one outside it.
    init(path: String, query: String?, prefix: String) throws(GatewayError) {
        let resolved = try Self.removeDotSegments(path)
        if path.hasPrefix(prefix) && !resolved.hasPrefix(prefix) {
            throw GatewayError.invalidRequest(
                "The path leaves \(prefix) once its dot segments ('.', '..') are resolved; send the path without them.")
        }
        self.path = resolved
        self.query = query
        self.changed = resolved != path
    }

    /// Whether the path is under `prefix` (the proxy prefix).
    func isUnder(_ prefix: String) -> Bool { path.hasPrefix(prefix) }

    /// Refuses what a provider might decode into other segments than CapGate saw: encoded
    /// slashes and backslashes (`%2f`, `%5c`), raw backslashes, and `#`.
    func checkForwardable() throws(GatewayError) {
        let lowered = path.lowercased()
        if lowered.contains("%2f") || lowered.contains("%5c") || path.contains("\\") {
            throw GatewayError.invalidRequest(
                "The path holds an encoded slash or a backslash (%2F, %5C or \\), which is not forwarded; use '/' between segments.")
        }
        if path.contains("#") {
            throw GatewayError.invalidRequest("The path holds a '#', which is not forwarded; percent-encode it as %23.")
        }
    }

    /// RFC 3986 §5.2.4 on an absolute path: `.` segments are dropped, `..` removes the segment
    /// before it. A path not starting with `/` (`*`, absolute-form leftovers) is returned as is.
    static func removeDotSegments(_ path: String) throws(GatewayError) -> String {
        guard path.hasPrefix("/"), path.contains(".") || path.contains("%") else { return path }
        let segments = path.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        var output: [Substring] = []
        output.reserveCapacity(segments.count)
        for (index, segment) in segments.enumerated() {
            let last = index == segments.count - 1
            switch try dotSegment(segment) {
            case 0:
                output.append(segment)
            case 1:
                if last { output.append("") }
            default:
                guard !output.isEmpty else {
                    throw GatewayError.invalidRequest("The path climbs above the root with '..'; send the path without dot segments.")
                }
                output.removeLast()
                if last { output.append("") }
            }
        }
        return "/" + output.joined(separator: "/")
    }

    /// 1 for a `.` segment, 2 for `..` (either with any of its dots as `%2e`/`%2E`), 0 otherwise.
    static func dotSegment(_ segment: Substring) throws(GatewayError) -> Int {
        let name = segment.prefix { $0 != ";" }
        guard name.count <= 6 else { return 0 }
        let decoded = name.lowercased().replacingOccurrences(of: "%2e", with: ".")
        let kind = decoded == "." ? 1 : decoded == ".." ? 2 : 0
        if kind != 0 && name.count != segment.count {
            throw GatewayError.invalidRequest("A dot segment with ';' parameters ('..;') is not accepted in a path.")
        }
        return kind
    }
}
