import Foundation
import NIOSSL
import PostgresNIO

/// A parsed `postgres://user:password@host:port/db?sslmode=…` URL.
///
/// As with libpq, the URL may name several hosts, each with its own port
/// (`postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write`): the gateway then uses
/// whichever of them accepts writes and follows a failover to another (see ``PrimaryFollower``).
/// `host` and `port` are the first of ``hosts``.
public struct DatabaseURL: Sendable {
    /// One `host:port` of the URL.
    public struct Endpoint: Sendable, Hashable, CustomStringConvertible {
        public var host: String
        public var port: Int

        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }

        /// `host:port`, with an IPv6 address in brackets.
        public var description: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }
    }

    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: String
    /// Every host of the URL, in its order (one for a single-host URL).
    public var hosts: [Endpoint]
    /// libpq's `target_session_attrs`, when the URL gives it. The gateway always needs a host
    /// that accepts writes, so only `read-write`, `primary` and `any` are accepted.
    public var targetSessionAttrs: String?

    public init(_ text: String) throws {
        let (hosts, singleHostText) = try Self.splitHosts(text)
        guard let components = URLComponents(string: singleHostText),
            let scheme = components.scheme, ["postgres", "postgresql"].contains(scheme),
            let host = components.host, !host.isEmpty
        else {
            throw ConfigurationError(key: "database.url", problem: "is not a postgres:// URL")
        }
        self.host = host
        self.port = components.port ?? 5432
        self.username = components.user?.removingPercentEncoding ?? "postgres"
        self.password = components.password?.removingPercentEncoding
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        self.database = path.isEmpty ? self.username : path
        self.sslMode = components.queryItems?.first { $0.name == "sslmode" }?.value ?? "prefer"
        self.hosts = hosts ?? [Endpoint(host: host, port: port)]
        self.targetSessionAttrs = components.queryItems?.first { $0.name == "target_session_attrs" }?.value
        if let attrs = targetSessionAttrs, !["read-write", "primary", "any"].contains(attrs) {
            throw ConfigurationError(
                key: "database.url", problem: "has target_session_attrs=\(attrs); the gateway writes, so use read-write")
        }
    }

    public init(host: String, port: Int, username: String, password: String?, database: String) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.sslMode = "disable"
        self.hosts = [Endpoint(host: host, port: port)]
        self.targetSessionAttrs = nil
    }

    /// A URL naming all of `endpoints` (in order) with this one's user, database and options.
    public func with(hosts endpoints: [Endpoint]) -> DatabaseURL {
        precondition(!endpoints.isEmpty, "a database URL needs a host")
        var url = self
        url.hosts = endpoints
        url.host = endpoints[0].host
        url.port = endpoints[0].port
        if endpoints.count > 1 && url.targetSessionAttrs == nil { url.targetSessionAttrs = "read-write" }
        return url
    }

    /// This URL pointed at one of its hosts only.
    public func only(_ endpoint: Endpoint) -> DatabaseURL {
        var url = with(hosts: [endpoint])
        url.targetSessionAttrs = targetSessionAttrs
        return url
    }

    /// True when the URL names more than one host.
    public var isMultiHost: Bool { hosts.count > 1 }

    /// The URL text (with the password, so never log it).
    public var text: String {
        var s = "postgres://\(username)"
        if let password { s += ":\(password.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? password)" }
        let authority = isMultiHost ? hosts.map(\.description).joined(separator: ",") : "\(host):\(port)"
        s += "@\(authority)/\(database)?sslmode=\(sslMode)"
        if let targetSessionAttrs { s += "&target_session_attrs=\(targetSessionAttrs)" }
        return s
    }

    /// The same as ``text`` without the password (for logs).
    public var redacted: String {
        var url = self
        url.password = password == nil ? nil : "xxxxx"
        return url.text
    }

    /// How a connection to `host` uses TLS under `sslmode`: loopback hosts skip TLS unless it
    /// is required.
    enum TLSChoice { case disable, prefer, require }

    func tlsChoice(for host: String) -> TLSChoice {
        switch sslMode {
        case "disable": return .disable
        case "require", "verify-ca", "verify-full": return .require
        default:
            let loopback = host == "localhost" || host.hasPrefix("127.") || host == "::1"
            return loopback ? .disable : .prefer
        }
    }

    /// A PostgresNIO client configuration with a bounded pool.
    /// - Parameter statementTimeout: sent as the connections' `statement_timeout`, so that a
    ///   statement the gateway stopped waiting for (``Database/run(lateResult:_:)``) also ends on
    ///   the server.
    /// - Parameter slotLeaseSeconds: this gateway's `rate.leaseSeconds`, carried by each of its
    ///   sessions as `capgate.slot_lease_seconds`: the lease its admissions give the concurrency
    ///   slots they take (SPEC §14: each slot keeps the lease of the gateway that holds it; the
    ///   shared `config_versions.slot_lease_seconds` is only the default for other sessions).
    public func clientConfiguration(
        maxConnections: Int, statementTimeout: Duration? = nil, slotLeaseSeconds: Int? = nil
    ) -> PostgresClient.Configuration {
        let tls: PostgresClient.Configuration.TLS
        switch tlsChoice(for: host) {
        case .disable: tls = .disable
        case .require: tls = .require(.makeClientConfiguration())
        case .prefer: tls = .prefer(.makeClientConfiguration())
        }
        var config = PostgresClient.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tls)
        config.options.maximumConnections = maxConnections
        // No minimum of kept connections: PostgresNIO 1.33's pool asserts (a precondition, so in
        // release builds too) that it holds at least its minimum when a lease asks for a new
        // connection, which is false while PostgreSQL is down and the pool is re-opening them;
        // a crash of PostgreSQL under load then crashed the gateway (CrashTests found it). Idle
        // connections are kept for a long time instead, and none is pinged while idle: a
        // connection the server dropped is found out by the next query that uses it (503 for
        // that call, as with any outage).
        config.options.minimumConnections = 0
        config.options.connectionIdleTimeout = .seconds(600)
        config.options.keepAliveBehavior = nil
        config.options.connectTimeout = .seconds(3)
        if let statementTimeout {
            config.options.additionalStartupParameters.append(("statement_timeout", "\(Self.milliseconds(statementTimeout))"))
        }
        if let slotLeaseSeconds {
            config.options.additionalStartupParameters.append(("capgate.slot_lease_seconds", "\(slotLeaseSeconds)"))
        }
        return config
    }

    /// A single-connection configuration for `endpoint` (the failover probe).
    func connectionConfiguration(for endpoint: Endpoint, connectTimeout: Duration) throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch tlsChoice(for: endpoint.host) {
        case .disable: tls = .disable
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var config = PostgresConnection.Configuration(
            host: endpoint.host, port: endpoint.port, username: username, password: password, database: database, tls: tls)
        config.options.connectTimeout = .milliseconds(Int64(Self.milliseconds(connectTimeout)))
        config.options.additionalStartupParameters = [("statement_timeout", "\(Self.milliseconds(connectTimeout))")]
        return config
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }

    /// For a URL whose authority names several hosts (`h1:5432,h2:5433`, IPv6 in brackets):
    /// those hosts, and the text with only the first of them (which `URLComponents` parses).
    /// For any other URL: nil and the text unchanged.
    static func splitHosts(_ text: String) throws -> ([Endpoint]?, String) {
        guard let schemeEnd = text.range(of: "://") else { return (nil, text) }
        let rest = text[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        let hostsStart = authority.lastIndex(of: "@").map { authority.index(after: $0) } ?? authority.startIndex
        let hostList = authority[hostsStart...]
        guard hostList.contains(",") else { return (nil, text) }
        var endpoints: [Endpoint] = []
        for item in hostList.split(separator: ",", omittingEmptySubsequences: false) {
            guard let endpoint = parseEndpoint(item) else {
                throw ConfigurationError(key: "database.url", problem: "has a host list that is not host:port,host:port")
            }
            endpoints.append(endpoint)
        }
        let first = endpoints[0]
        let single = String(text[..<hostsStart]) + first.description + String(text[authorityEnd...])
        return (endpoints, single)
    }

    static func parseEndpoint(_ item: Substring) -> Endpoint? {
        var host: Substring
        var portText: Substring?
        if item.hasPrefix("[") {
            guard let close = item.firstIndex(of: "]") else { return nil }
            host = item[item.index(after: item.startIndex)..<close]
            let after = item[item.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return nil }
                portText = after.dropFirst()
            }
        } else if let colon = item.firstIndex(of: ":") {
            host = item[..<colon]
            portText = item[item.index(after: colon)...]
        } else {
            host = item
        }
        guard !host.isEmpty else { return nil }
        let port: Int
        if let portText {
            guard let parsed = Int(portText), (1...65535).contains(parsed) else { return nil }
            port = parsed
        } else {
            port = 5432
        }
        return Endpoint(host: String(host), port: port)
    }
}
