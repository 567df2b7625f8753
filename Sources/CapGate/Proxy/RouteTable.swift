import Foundation
import PostgresNIO
import Synchronization

/// One row of `routes` (SPEC §8): what a call to a method and path costs and which feature it uses.
public struct RouteRule: Sendable, Equatable {
    public var id: String
    /// `*` or an upper-case method.
    public var method: String
    /// The path, or for a prefix rule (`/v1/models*`) the part before the `*`; lower-cased.
    public var path: String
    public var prefix: Bool
    public var units: Int
    public var itemsField: String?
    public var feature: String?
    public var featureHeader: Bool
    /// The only features `CapGate-Feature` may name on this route (another is 400); nil: any.
    public var headerFeatures: [String]? = nil
    public var allowed: Bool

    /// Most specific first: exact before prefix, longer prefix first, a method before `*`.
    static func moreSpecific(_ a: RouteRule, _ b: RouteRule) -> Bool {
        if a.prefix != b.prefix { return !a.prefix }
        if a.path.count != b.path.count { return a.path.count > b.path.count }
        if (a.method == "*") != (b.method == "*") { return a.method != "*" }
        return a.id < b.id
    }

    func matches(method: String, path: String) -> Bool {
        guard self.method == "*" || self.method == method else { return false }
        return prefix ? path.hasPrefix(self.path) : path == self.path
    }
}

/// The route table as the gateway matches calls against it: loaded from `routes` on first use
/// and again whenever an admission answers `stale_routes` (the table's version in
/// `config_versions`, bumped by a trigger on every change, is newer than the one the call was
/// matched with). Every admission carries the version it used, so a change made through the
/// operator API applies to the next request on every gateway on the database.
public final class RouteTable: Sendable {
    public struct Snapshot: Sendable {
        public var version: Int64
        /// Most specific first.
        public var rules: [RouteRule]

        /// The rule for a call; nil: no rule matches (1 unit, no feature: SPEC §2).
        /// `path` is ``RouteTable/canonicalPath(_:)``'s; `method` as sent.
        public func match(method: String, path: String) -> RouteRule? {
            let method = method.uppercased()
            return rules.first { $0.matches(method: method, path: path) }
        }
    }

    let database: Database
    private let current = Mutex<Snapshot?>(nil)

    public init(database: Database) {
        self.database = database
    }

    /// The table, loaded on first use.
    public func snapshot() async throws -> Snapshot {
        if let loaded = current.withLock({ $0 }) { return loaded }
        return try await reload()
    }

    /// Reads the table and its version in one statement (one snapshot of the database).
    @discardableResult
    public func reload() async throws -> Snapshot {
        let database = self.database
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT v.routes, r.id, r.method, r.path, r.units, r.items_field, r.feature, r.feature_header, r.allowed,
                       r.header_features
                  FROM config_versions v LEFT JOIN routes r ON true
                 WHERE v.singleton
                """, logger: database.logger
            ).decode((Int64, String?, String?, String?, Int32?, String?, String?, Bool?, Bool?, [String]?).self).collect()
        }
        var snapshot = Snapshot(version: rows.first?.0 ?? 0, rules: [])
        for row in rows {
            guard let id = row.1, let method = row.2, let path = row.3 else { continue }
            let prefix = path.hasSuffix("*")
            snapshot.rules.append(
                RouteRule(
                    id: id, method: method, path: (prefix ? String(path.dropLast()) : path).lowercased(), prefix: prefix,
                    units: Int(row.4 ?? 1), itemsField: row.5, feature: row.6, featureHeader: row.7 ?? false, headerFeatures: row.9,
                    allowed: row.8 ?? true))
        }
        snapshot.rules.sort(by: RouteRule.moreSpecific)
        let loaded = snapshot
        current.withLock { held in
            if held == nil || held!.version <= loaded.version { held = loaded }
        }
        return loaded
    }

    /// The route table's version in the database (`config_versions.routes`).
    public func version() async throws -> Int64 {
        let database = self.database
        let rows = try await database.run { client in
            try await client.query("SELECT routes FROM config_versions WHERE singleton", logger: database.logger)
                .decode(Int64.self).collect()
        }
        guard let version = rows.first else { throw DatabaseError.other("config_versions has no row") }
        return version
    }

    /// Whether `feature` is an active feature, with the route table's version, in one snapshot:
    /// read only for a call a bound token is refused (SPEC §8: an unknown header feature is 400
    /// before the 403), and the version says whether the call was matched with the current table.
    public func featureState(_ feature: String) async throws -> (version: Int64, active: Bool) {
        let database = self.database
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT v.routes, EXISTS (SELECT 1 FROM features f WHERE f.id = \(feature) AND f.is_active)
                  FROM config_versions v WHERE v.singleton
                """, logger: database.logger
            ).decode((Int64, Bool).self).collect()
        }
        guard let row = rows.first else { throw DatabaseError.other("config_versions has no row") }
        return (row.0, row.1)
    }

    /// The path a rule is matched against: lower-cased, one trailing `/` dropped. nil for a path
    /// whose meaning another server could read differently from the rule that would match it:
    /// `.` or `..` segments, empty segments (`//`), a backslash, `;`, or a percent-escape of `/`,
    /// `\`, `.` or of a letter, digit, `-`, `_` or `~` (which no client needs to escape). Such a
    /// path could match a free route here and reach a metered endpoint upstream.
    public static func canonicalPath(_ path: Substring) -> String? {
        let bytes = Array(path.utf8)
        var i = 0
        while i < bytes.count {
            let b = bytes[i]
            if b == UInt8(ascii: "\\") || b == UInt8(ascii: ";") { return nil }
            if b == UInt8(ascii: "%") {
                guard i + 2 < bytes.count, let value = hexByte(bytes[i + 1], bytes[i + 2]) else { return nil }
                let c = Character(Unicode.Scalar(value))
                if c == "/" || c == "\\" || c == "." || c.isASCII && (c.isLetter || c.isNumber || c == "-" || c == "_" || c == "~") {
                    return nil
                }
                i += 3
                continue
            }
            i += 1
        }
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        for (index, segment) in segments.enumerated() {
            if segment == "." || segment == ".." { return nil }
            if segment.isEmpty && index != segments.count - 1 { return nil }
        }
        var canonical = path.lowercased()
        if canonical.count > 1, canonical.hasSuffix("/") { canonical.removeLast() }
        return canonical
    }

    private static func hexByte(_ a: UInt8, _ b: UInt8) -> UInt8? {
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        guard let high = nibble(a), let low = nibble(b) else { return nil }
        return high << 4 | low
    }
}
