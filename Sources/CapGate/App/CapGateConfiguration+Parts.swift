import Configuration
import Foundation

/// The parts of ``CapGateConfiguration``, each read by its own `init(reader:)` with its keys
/// beside it (`keys`, and `secretKeys` for values never printed): a new key is added to its part,
/// and the whole configuration's lists are made of the parts'.

/// `http.*`: the listener.
public struct HTTPSettings: Sendable {
    /// `http.host` / `HTTP_HOST` (default `127.0.0.1`).
    public var host: String
    /// `http.port` / `HTTP_PORT` (default `8080`; `0` picks a free port).
    public var port: Int
    /// `http.idleTimeout` / `HTTP_IDLE_TIMEOUT` (seconds, default `60`): a client connection with no
    /// request in progress (or a request whose reading stalled) is closed after this much silence.
    public var idleTimeout: Double
    /// `http.headerTimeout` / `HTTP_HEADER_TIMEOUT` (seconds, default `10`): once the first byte of a
    /// request arrives, its whole head (request line and headers) must arrive within this, else the
    /// connection is closed (a client sending its headers byte by byte cannot hold a connection).
    public var headerTimeout: Double
    /// `http.bodyTimeout` / `HTTP_BODY_TIMEOUT` (seconds, default `30`): a request's body must arrive
    /// whole within this time of its head, else `408 request_timeout` and the connection closes.
    public var bodyTimeout: Double
    /// `http.maxConnections` / `HTTP_MAX_CONNECTIONS` (default `10000`): the most client connections
    /// open at once; past it, new connections wait in the listen backlog until one closes.
    public var maxConnections: Int
    /// `http.tls.certificate` / `HTTP_TLS_CERTIFICATE` and `http.tls.key` / `HTTP_TLS_KEY` (PEM
    /// files, default unset: plain HTTP): serve HTTPS on the listen port, re-read on SIGHUP (see
    /// ``ListenerTLSFiles``). Both or neither.
    public var tls: ListenerTLSFiles?

    static let keys = [
        "http.host", "http.port", "http.idleTimeout", "http.headerTimeout", "http.bodyTimeout", "http.maxConnections",
        "http.tls.certificate", "http.tls.key",
    ]

    init(reader: ConfigReader) throws {
        typealias C = CapGateConfiguration
        host = reader.string(forKey: "http.host", default: "127.0.0.1")
        port = try C.int(reader, "http.port", default: 8080, range: 0...65535)
        idleTimeout = try C.double(reader, "http.idleTimeout", default: 60)
        headerTimeout = try C.double(reader, "http.headerTimeout", default: 10)
        bodyTimeout = try C.double(reader, "http.bodyTimeout", default: 30)
        maxConnections = try C.int(reader, "http.maxConnections", default: 10_000, range: 1...1_000_000)
        // Only both-or-neither here: the files are read where they are served (``ListenerTLS``),
        // so `capgate migrate` or `verify` never needs to read the server's private key.
        tls = try ListenerTLSFiles.pair(
            certificate: C.nonEmpty(reader.string(forKey: "http.tls.certificate")),
            key: C.nonEmpty(reader.string(forKey: "http.tls.key")))
    }
}

/// `database.*`: the PostgreSQL the gateway charges in.
public struct DatabaseSettings: Sendable {
    /// `database.url` / `DATABASE_URL`: `postgres://user:password@host:port/db` (secret: holds a password).
    /// Unset under `capgate dev` means the embedded PostgreSQL.
    public var url: String?
    /// `database.maxConnections` / `DATABASE_MAX_CONNECTIONS` (default `20`): the pool bound.
    public var maxConnections: Int
    /// `database.timeout` / `DATABASE_TIMEOUT` (seconds, default `5`): how long a request waits for the
    /// database before it is answered 503 (fail closed).
    public var timeout: Double
    /// `database.durability` / `DATABASE_DURABILITY` (default `durable`): `relaxed` commits admissions
    /// with `synchronous_commit = off` (faster; a database crash may lose the last fraction of a
    /// second of counts).
    public var durability: String
    /// `database.admissionQueueLimit` / `DATABASE_ADMISSION_QUEUE_LIMIT` (default `10000`): the most
    /// calls waiting at once for an admission transaction; past it a call is answered 503 at once.
    /// A queued call waits at most `database.timeout` from its arrival (503 after it).
    public var admissionQueueLimit: Int

    static let keys = [
        "database.url", "database.maxConnections", "database.timeout", "database.durability", "database.admissionQueueLimit",
    ]
    static let secretKeys: Set<String> = ["database.url"]

    init(reader: ConfigReader) throws {
        typealias C = CapGateConfiguration
        url = C.nonEmpty(reader.string(forKey: "database.url", isSecret: true))
        maxConnections = try C.int(reader, "database.maxConnections", default: 20, range: 1...1000)
        timeout = try C.double(reader, "database.timeout", default: 5)
        admissionQueueLimit = try C.int(reader, "database.admissionQueueLimit", default: 10_000, range: 1...10_000_000)
        durability = reader.string(forKey: "database.durability", default: "durable")
        guard ["durable", "relaxed"].contains(durability) else {
            throw ConfigurationError(key: "database.durability", problem: "must be 'durable' or 'relaxed'")
        }
        if let url, (try? DatabaseURL(url)) == nil {
            throw ConfigurationError(key: "database.url", problem: "is not a postgres://user:password@host:port/db URL")
        }
    }
}

/// `upstream.*`: the provider calls are forwarded to.
public struct UpstreamSettings: Sendable {
    /// `upstream.url` / `UPSTREAM_URL`: the provider base URL.
    public var url: String?
    /// `upstream.apiKey` / `UPSTREAM_API_KEY` (secret): sent upstream as `x-api-key`.
    public var apiKey: String?
    /// `upstream.timeout` / `UPSTREAM_TIMEOUT` (seconds, default `600`): time allowed for the response head, connecting included.
    public var timeout: Double
    /// `upstream.connectTimeout` / `UPSTREAM_CONNECT_TIMEOUT` (seconds, default `10`).
    public var connectTimeout: Double
    /// `upstream.idleTimeout` / `UPSTREAM_IDLE_TIMEOUT` (seconds, default `300`): longest silence while a body streams.
    public var idleTimeout: Double
    /// `upstream.maxConnections` / `UPSTREAM_MAX_CONNECTIONS` (default `512`): connections to the provider open at once;
    /// further calls wait for one, within `upstream.timeout`.
    public var maxConnections: Int
    /// `upstream.caFile` / `UPSTREAM_CA_FILE`: a PEM file of trust roots for an `https` provider, used
    /// instead of the system's roots (a private CA, a TLS-inspecting egress proxy, tests). Unset: the
    /// system's roots. Read once at start; a file that holds no readable certificate stops the start.
    public var caFile: String?

    static let keys = [
        "upstream.url", "upstream.apiKey", "upstream.timeout", "upstream.connectTimeout", "upstream.caFile", "upstream.idleTimeout",
        "upstream.maxConnections",
    ]
    static let secretKeys: Set<String> = ["upstream.apiKey"]

    init(reader: ConfigReader) throws {
        typealias C = CapGateConfiguration
        url = C.nonEmpty(reader.string(forKey: "upstream.url"))
        apiKey = C.nonEmpty(reader.string(forKey: "upstream.apiKey", isSecret: true))
        timeout = try C.double(reader, "upstream.timeout", default: 600)
        connectTimeout = try C.double(reader, "upstream.connectTimeout", default: 10)
        idleTimeout = try C.double(reader, "upstream.idleTimeout", default: 300)
        maxConnections = try C.int(reader, "upstream.maxConnections", default: 512, range: 1...100_000)
        caFile = C.nonEmpty(reader.string(forKey: "upstream.caFile"))
        if let url, !C.isHTTPURL(url) {
            throw ConfigurationError(key: "upstream.url", problem: "is not an absolute http(s) URL")
        }
    }
}

/// `operator.*`: who may use the operator API.
public struct OperatorSettings: Sendable {
    /// `operator.token` / `OPERATOR_TOKEN` (secret): the operator's bearer token; unset disables the operator API.
    public var token: String?
    /// `operator.tokens` / `OPERATOR_TOKENS` (secret, default none): more operator tokens, each with
    /// the name the audit log gives its changes, as `name:token,name:token` (SPEC §7; a JSON array
    /// of `{"name", "token"}` objects as text is also read). Several let one be rotated without
    /// downtime; `operator.token` stays, named `operator`.
    public var tokens: [OperatorToken]

    /// Every operator token: the unnamed `operator.token` (as `operator`), then `operator.tokens`.
    public var all: [OperatorToken] {
        (token.map { [OperatorToken(name: OperatorToken.defaultName, token: $0)] } ?? []) + tokens
    }

    static let keys = ["operator.token", "operator.tokens"]
    static let secretKeys: Set<String> = ["operator.token", "operator.tokens"]

    init(reader: ConfigReader) throws {
        (token, tokens) = try OperatorToken.configured(reader: reader)
    }
}

/// `jwt.*`: end-user tokens (SPEC §3).
public struct JWTSettings: Sendable {
    /// `jwt.secret` / `JWT_SECRET` (secret): HS256 shared secret.
    public var secret: String?
    /// `jwt.jwksFile` / `JWT_JWKS_FILE`: JWKS file with RS256/ES256 public keys.
    public var jwksFile: String?
    /// `jwt.companyClaim` / `JWT_COMPANY_CLAIM` (default `company_id`): dotted claim path of the company id.
    public var companyClaim: String
    /// `jwt.featureClaim` / `JWT_FEATURE_CLAIM` (default `capgate_features`, empty = none read):
    /// dotted claim path of the features a token may be charged to (a feature id or a list of
    /// them, SPEC §8); a token without the claim is unbound.
    public var featureClaim: String?
    /// `jwt.audience` / `JWT_AUDIENCE` (default unset): when set, a token's `aud` (a string or an
    /// array) must contain it, else 401.
    public var audience: String?
    /// `jwt.issuer` / `JWT_ISSUER` (default unset): when set, a token's `iss` must equal it, else 401.
    public var issuer: String?
    /// `jwt.leeway` / `JWT_LEEWAY` (seconds, default `0`: none): clock skew allowed when checking
    /// a token's `exp` and `nbf` (and `jwt.maxLifetime`). By default an expired token is 401 at once (SPEC §3).
    public var leeway: Int
    /// `jwt.maxLifetime` / `JWT_MAX_LIFETIME` (seconds, default unset = off): a token whose `exp` is
    /// further than this past its `iat` (or past now, without `iat`) is 401.
    public var maxLifetime: Int?

    static let keys = [
        "jwt.secret", "jwt.jwksFile", "jwt.companyClaim", "jwt.featureClaim", "jwt.audience", "jwt.issuer", "jwt.leeway",
        "jwt.maxLifetime",
    ]
    static let secretKeys: Set<String> = ["jwt.secret"]

    init(reader: ConfigReader) throws {
        typealias C = CapGateConfiguration
        secret = C.nonEmpty(reader.string(forKey: "jwt.secret", isSecret: true))
        jwksFile = C.nonEmpty(reader.string(forKey: "jwt.jwksFile"))
        companyClaim = reader.string(forKey: "jwt.companyClaim", default: "company_id")
        featureClaim = C.nonEmpty(reader.string(forKey: "jwt.featureClaim", default: "capgate_features"))
        audience = C.nonEmpty(reader.string(forKey: "jwt.audience"))
        issuer = C.nonEmpty(reader.string(forKey: "jwt.issuer"))
        leeway = try C.int(reader, "jwt.leeway", default: 0, range: 0...3600)
        let lifetime = try C.int(reader, "jwt.maxLifetime", default: 0, range: 0...(86400 * 3660))
        maxLifetime = lifetime > 0 ? lifetime : nil
        // A short HS256 secret can be guessed offline from one token (RFC 7518 §3.2 asks for a
        // key as long as the hash: 32 bytes).
        if let secret, secret.utf8.count < 32 {
            throw ConfigurationError(
                key: "jwt.secret", problem: "is \(secret.utf8.count) bytes long; an HS256 secret must be at least 32 bytes")
        }
    }
}

/// `proxy.*`: what is forwarded and how much of a body is read.
public struct ProxySettings: Sendable {
    /// `proxy.prefix` / `PROXY_PREFIX` (default `/v1/`): paths forwarded upstream.
    public var prefix: String
    /// `proxy.maxBodyBytes` / `PROXY_MAX_BODY_BYTES` (default `33554432`, 32 MiB): request body limit (413 above).
    public var maxBodyBytes: Int
    /// `proxy.idempotencyMaxBytes` / `PROXY_IDEMPOTENCY_MAX_BYTES` (default `1048576`, 1 MiB, at most 64 MiB):
    /// the largest answer kept for retries with the same `Idempotency-Key`; a larger one is not
    /// kept and such a retry gets 409.
    public var idempotencyMaxBytes: Int
    /// `proxy.bodyBudgetBytes` / `PROXY_BODY_BUDGET_BYTES` (default `268435456`, 256 MiB): the most bytes
    /// of request bodies being read at once, all calls together (counted as bytes arrive, never by
    /// a declared `Content-Length`); a body that would exceed it is answered 503
    /// `overloaded_error`, nothing charged or forwarded. Keep it at least `proxy.maxBodyBytes`.
    public var bodyBudgetBytes: Int
    /// `proxy.companyShare` / `PROXY_COMPANY_SHARE` (percent, default `25`): the most one company may
    /// hold of `proxy.bodyBudgetBytes` (past it: 503) and of `upstream.maxConnections` (past it its
    /// calls wait their turn, within `upstream.timeout`), so one tenant cannot starve the others.
    /// `100` turns it off.
    public var companyShare: Int
    /// `proxy.maxJSONDepth` / `PROXY_MAX_JSON_DEPTH` (default `128`, at most `256`: the reader
    /// recurses once per level, on a thread's stack): the deepest
    /// nesting of a body CapGate reads (SPEC §2); deeper is 400 before admission.
    public var maxJSONDepth: Int

    static let keys = [
        "proxy.prefix", "proxy.maxBodyBytes", "proxy.idempotencyMaxBytes", "proxy.bodyBudgetBytes", "proxy.companyShare",
        "proxy.maxJSONDepth",
    ]

    init(reader: ConfigReader) throws {
        typealias C = CapGateConfiguration
        prefix = reader.string(forKey: "proxy.prefix", default: "/v1/")
        maxBodyBytes = try C.int(reader, "proxy.maxBodyBytes", default: 32 << 20, range: 1...(1 << 34))
        idempotencyMaxBytes = try C.int(reader, "proxy.idempotencyMaxBytes", default: 1 << 20, range: 0...(64 << 20))
        bodyBudgetBytes = try C.int(reader, "proxy.bodyBudgetBytes", default: 256 << 20, range: 1...(1 << 40))
        companyShare = try C.int(reader, "proxy.companyShare", default: 25, range: 1...100)
        maxJSONDepth = try C.int(reader, "proxy.maxJSONDepth", default: JSONParser.defaultMaxDepth, range: 1...256)
        if !prefix.hasPrefix("/") || !prefix.hasSuffix("/") {
            throw ConfigurationError(key: "proxy.prefix", problem: "must start and end with '/', such as /v1/")
        }
    }
}

/// `metrics.*`: who may read `/metrics`.
public struct MetricsSettings: Sendable {
    /// `metrics.token` / `METRICS_TOKEN` (secret, default unset): a bearer token that may read
    /// `/metrics` besides the operator token.
    public var token: String?
    /// `metrics.public` / `METRICS_PUBLIC` (default `false`): `true` lets anyone read `/metrics`.
    public var isPublic: Bool

    static let keys = ["metrics.token", "metrics.public"]
    static let secretKeys: Set<String> = ["metrics.token"]

    init(reader: ConfigReader) throws {
        token = CapGateConfiguration.nonEmpty(reader.string(forKey: "metrics.token", isSecret: true))
        isPublic = try CapGateConfiguration.bool(reader, "metrics.public", default: false)
    }
}
