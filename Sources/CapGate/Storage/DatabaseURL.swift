import Foundation
import PostgresNIO

/// A parsed `postgres://user:password@host:port/db?sslmode=…` URL.
public struct DatabaseURL: Sendable {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: String

    public init(_ text: String) throws {
        guard let components = URLComponents(string: text),
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
    }

    public init(host: String, port: Int, username: String, password: String?, database: String) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.sslMode = "disable"
    }

    /// The URL text (with the password, so never log it).
    public var text: String {
        var s = "postgres://\(username)"
        if let password { s += ":\(password.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? password)" }
        return s + "@\(host):\(port)/\(database)?sslmode=\(sslMode)"
    }

    /// A PostgresNIO client configuration with a bounded pool.
    /// - Parameter statementTimeout: sent as the connections' `statement_timeout`, so that a
    ///   statement the gateway stopped waiting for (``Database/run(lateResult:_:)``) also ends on
    ///   the server.
    public func clientConfiguration(maxConnections: Int, statementTimeout: Duration? = nil) -> PostgresClient.Configuration {
        let tls: PostgresClient.Configuration.TLS
        switch sslMode {
        case "disable": tls = .disable
        case "require", "verify-ca", "verify-full": tls = .require(.makeClientConfiguration())
        default:
            let loopback = host == "localhost" || host.hasPrefix("127.") || host == "::1"
            tls = loopback ? .disable : .prefer(.makeClientConfiguration())
        }
        var config = PostgresClient.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tls)
        config.options.maximumConnections = maxConnections
        // Up to 8 connections are opened at start and kept, and none is pinged while idle: the
        // pool arms an idle-timeout timer for every connection above the minimum and a
        // keep-alive timer for every idle one each time it is released, on Dispatch's timer
        // thread (a wake-up of another thread per query). A connection the server dropped is
        // found out by the next query that uses it (503 for that call, as with any outage).
        config.options.minimumConnections = min(maxConnections, 8)
        config.options.keepAliveBehavior = nil
        config.options.connectTimeout = .seconds(3)
        if let statementTimeout {
            let (seconds, attoseconds) = statementTimeout.components
            let milliseconds = max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
            config.options.additionalStartupParameters = [("statement_timeout", "\(milliseconds)")]
        }
        return config
    }
}
