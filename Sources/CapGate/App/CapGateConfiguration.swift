import Configuration
import Foundation
import SystemPackage

/// CapGate's whole configuration, read once at start from (highest first) command-line flags,
/// environment variables, `config/capgate.json`, then the defaults documented on each key.
public struct CapGateConfiguration: Sendable {
    /// `http.host` / `HTTP_HOST` (default `127.0.0.1`), `http.port` / `HTTP_PORT` (default `8080`; `0` picks a free port).
    public var host: String
    public var port: Int
    /// `http.idleTimeout` / `HTTP_IDLE_TIMEOUT` (seconds, default `60`): a client connection with no
    /// request in progress (or a request whose reading stalled) is closed after this much silence.
    public var httpIdleTimeout: Double
    /// `http.headerTimeout` / `HTTP_HEADER_TIMEOUT` (seconds, default `10`): once the first byte of a
    /// request arrives, its whole head (request line and headers) must arrive within this, else the
    /// connection is closed (a client sending its headers byte by byte cannot hold a connection).
    public var httpHeaderTimeout: Double
    /// `http.bodyTimeout` / `HTTP_BODY_TIMEOUT` (seconds, default `30`): a request's body must arrive
    /// whole within this time of its head, else `408 request_timeout` and the connection closes.
    public var httpBodyTimeout: Double
    /// `http.maxConnections` / `HTTP_MAX_CONNECTIONS` (default `10000`): the most client connections
    /// open at once; past it, new connections wait in the listen backlog until one closes.
    public var httpMaxConnections: Int
    /// `http.tls.certificate` / `HTTP_TLS_CERTIFICATE` and `http.tls.key` / `HTTP_TLS_KEY` (PEM
    /// files, default unset: plain HTTP): serve HTTPS on the listen port, re-read on SIGHUP (see
    /// ``ListenerTLSFiles``). Both or neither.
    public var httpTLS: ListenerTLSFiles?
    /// `database.url` / `DATABASE_URL`: `postgres://user:password@host:port/db` (secret: holds a password).
    /// Unset under `capgate dev` means the embedded PostgreSQL.
    public var databaseURL: String?
    /// `database.maxConnections` / `DATABASE_MAX_CONNECTIONS` (default `20`): the pool bound.
    public var databaseMaxConnections: Int
    /// `database.timeout` / `DATABASE_TIMEOUT` (seconds, default `5`): how long a request waits for the
    /// database before it is answered 503 (fail closed).
    public var databaseTimeout: Double
    /// `database.durability` / `DATABASE_DURABILITY` (default `durable`): `relaxed` commits admissions
    /// with `synchronous_commit = off` (faster; a database crash may lose the last fraction of a
    /// second of counts).
    public var databaseDurability: String
    /// `database.admissionQueueLimit` / `DATABASE_ADMISSION_QUEUE_LIMIT` (default `10000`): the most
    /// calls waiting at once for an admission transaction; past it a call is answered 503 at once.
    /// A queued call waits at most `database.timeout` from its arrival (503 after it).
    public var databaseAdmissionQueueLimit: Int
    /// `upstream.url` / `UPSTREAM_URL`: the provider base URL.
    public var upstreamURL: String?
    /// `upstream.apiKey` / `UPSTREAM_API_KEY` (secret): sent upstream as `x-api-key`.
    public var upstreamAPIKey: String?
    /// `upstream.timeout` / `UPSTREAM_TIMEOUT` (seconds, default `600`): time allowed for the response head, connecting included.
    public var upstreamTimeout: Double
    /// `upstream.connectTimeout` / `UPSTREAM_CONNECT_TIMEOUT` (seconds, default `10`).
    public var upstreamConnectTimeout: Double
    /// `upstream.idleTimeout` / `UPSTREAM_IDLE_TIMEOUT` (seconds, default `300`): longest silence while a body streams.
    public var upstreamIdleTimeout: Double
    /// `upstream.maxConnections` / `UPSTREAM_MAX_CONNECTIONS` (default `512`): connections to the provider open at once;
    /// further calls wait for one, within `upstream.timeout`.
    public var upstreamMaxConnections: Int
    /// `upstream.caFile` / `UPSTREAM_CA_FILE`: a PEM file of trust roots for an `https` provider, used
    /// instead of the system's roots (a private CA, a TLS-inspecting egress proxy, tests). Unset: the
    /// system's roots. Read once at start; a file that holds no readable certificate stops the start.
    public var upstreamCAFile: String?
    /// `operator.token` / `OPERATOR_TOKEN` (secret): the operator's bearer token; unset disables the operator API.
    public var operatorToken: String?
    /// `operator.tokens` / `OPERATOR_TOKENS` (secret, default none): more operator tokens, each with
    /// the name the audit log gives its changes, as `name:token,name:token` (SPEC §7; a JSON array
    /// of `{"name", "token"}` objects as text is also read). Several let one be rotated without
    /// downtime; `operator.token` stays, named `operator`.
    public var operatorTokens: [OperatorToken]

    /// Every operator token: the unnamed `operator.token` (as `operator`), then `operator.tokens`.
    public var allOperatorTokens: [OperatorToken] {
        (operatorToken.map { [OperatorToken(name: OperatorToken.defaultName, token: $0)] } ?? []) + operatorTokens
    }
    /// `jwt.secret` / `JWT_SECRET` (secret): HS256 shared secret.
    public var jwtSecret: String?
    /// `jwt.jwksFile` / `JWT_JWKS_FILE`: JWKS file with RS256/ES256 public keys.
    public var jwtJWKSFile: String?
    /// `jwt.companyClaim` / `JWT_COMPANY_CLAIM` (default `company_id`): dotted claim path of the company id.
    public var jwtCompanyClaim: String
    /// `jwt.featureClaim` / `JWT_FEATURE_CLAIM` (default `capgate_features`, empty = none read):
    /// dotted claim path of the features a token may be charged to (a feature id or a list of
    /// them, SPEC §8); a token without the claim is unbound.
    public var jwtFeatureClaim: String?
    /// `jwt.audience` / `JWT_AUDIENCE` (default unset): when set, a token's `aud` (a string or an
    /// array) must contain it, else 401.
    public var jwtAudience: String?
    /// `jwt.issuer` / `JWT_ISSUER` (default unset): when set, a token's `iss` must equal it, else 401.
    public var jwtIssuer: String?
    /// `jwt.leeway` / `JWT_LEEWAY` (seconds, default `0`: none): clock skew allowed when checking
    /// a token's `exp` and `nbf` (and `jwt.maxLifetime`). By default an expired token is 401 at once (SPEC §3).
    public var jwtLeeway: Int
    /// `proxy.prefix` / `PROXY_PREFIX` (default `/v1/`): paths forwarded upstream.
    public var proxyPrefix: String
    /// `proxy.maxBodyBytes` / `PROXY_MAX_BODY_BYTES` (default `33554432`, 32 MiB): request body limit (413 above).
    public var proxyMaxBodyBytes: Int
    /// `proxy.idempotencyMaxBytes` / `PROXY_IDEMPOTENCY_MAX_BYTES` (default `1048576`, 1 MiB, at most 64 MiB):
    /// the largest answer kept for retries with the same `Idempotency-Key`; a larger one is not
    /// kept and such a retry gets 409.
    public var proxyIdempotencyMaxBytes: Int
    /// `proxy.bodyBudgetBytes` / `PROXY_BODY_BUDGET_BYTES` (default `268435456`, 256 MiB): the most bytes
    /// of request bodies being read at once, all calls together (counted as bytes arrive, never by
    /// a declared `Content-Length`); a body that would exceed it is answered 503
    /// `overloaded_error`, nothing charged or forwarded. Keep it at least `proxy.maxBodyBytes`.
    public var proxyBodyBudgetBytes: Int
    /// `proxy.companyShare` / `PROXY_COMPANY_SHARE` (percent, default `25`): the most one company may
    /// hold of `proxy.bodyBudgetBytes` (past it: 503) and of `upstream.maxConnections` (past it its
    /// calls wait their turn, within `upstream.timeout`), so one tenant cannot starve the others.
    /// `100` turns it off.
    public var proxyCompanyShare: Int
    /// `proxy.maxJSONDepth` / `PROXY_MAX_JSON_DEPTH` (default `128`, at most `256`: the reader
    /// recurses once per level, on a thread's stack): the deepest
    /// nesting of a body CapGate reads (SPEC §2); deeper is 400 before admission.
    public var proxyMaxJSONDepth: Int
    /// `metrics.token` / `METRICS_TOKEN` (secret, default unset): a bearer token that may read
    /// `/metrics` besides the operator token.
    public var metricsToken: String?
    /// `metrics.public` / `METRICS_PUBLIC` (default `false`): `true` lets anyone read `/metrics`.
    public var metricsPublic: Bool
    /// `jwt.maxLifetime` / `JWT_MAX_LIFETIME` (seconds, default unset = off): a token whose `exp` is
    /// further than this past its `iat` (or past now, without `iat`) is 401.
    public var jwtMaxLifetime: Int?
    /// `billing.rolloverInterval` / `BILLING_ROLLOVER_INTERVAL` (seconds, default `0` = off).
    public var billingRolloverInterval: Int
    /// `spool.directory` / `SPOOL_DIRECTORY` (default `.capgate/spool`): where a refund, give-back,
    /// settlement or kept answer waits (fsynced) while the database cannot take it; replayed at
    /// start, while running and at shutdown. One folder per gateway process.
    public var spoolDirectory: String
    /// `log.level` / `LOG_LEVEL` (default `info`).
    public var logLevel: String
    /// `notifications.*`: threshold webhooks (SPEC §9; see ``NotificationSettings``).
    public var notifications: NotificationSettings
    /// `costs.*`: how a call's cost is held and settled (SPEC §11; see ``CostSettings``).
    public var costs: CostSettings
    /// `apple.*`: App Store signed notifications and transactions (SPEC §12; see ``AppleSettings``).
    public var apple: AppleSettings
    /// `rate.leaseSeconds` / `RATE_LEASE_SECONDS` (default `600`): how long a concurrency slot
    /// (SPEC §14) outlives a gateway that died before its call ended.
    public var rateLeaseSeconds: Int
    /// `ledger.retentionMonths` / `LEDGER_RETENTION_MONTHS` (SPEC §7; default: every month kept):
    /// whole months kept besides the current one (1–1200). A month older is dropped by the
    /// gateway's hourly ledger job, `capgate rollover` and `capgate ledger drop` once it is
    /// exported (`capgate ledger export`) and holds no unsettled charge (``LedgerRetention``).
    public var ledgerRetentionMonths: Int?

    /// Every key CapGate reads, with its environment variable (used by docs and `--help`).
    public static let keys: [String] =
        [
            "http.host", "http.port", "http.idleTimeout", "http.headerTimeout", "http.bodyTimeout", "http.maxConnections",
            "http.tls.certificate", "http.tls.key",
            "database.url", "database.maxConnections", "database.timeout", "database.durability", "database.admissionQueueLimit",
            "upstream.url", "upstream.apiKey", "upstream.timeout", "upstream.connectTimeout", "upstream.caFile",
            "upstream.idleTimeout", "upstream.maxConnections", "operator.token", "operator.tokens", "jwt.secret", "jwt.jwksFile",
            "jwt.companyClaim",
            "jwt.featureClaim", "jwt.audience", "jwt.issuer", "jwt.leeway", "jwt.maxLifetime", "proxy.maxJSONDepth", "proxy.companyShare",
            "metrics.token", "metrics.public", "notifications.retentionDays",
            "proxy.prefix", "proxy.maxBodyBytes", "proxy.idempotencyMaxBytes", "proxy.bodyBudgetBytes", "billing.rolloverInterval",
            "spool.directory", "log.level", "notifications.webhookUrl", "notifications.webhookSecret", "notifications.thresholds",
            "notifications.timeout", "notifications.retryFor", "notifications.retryDelay", "notifications.maxRetryDelay",
            "notifications.pollInterval", "notifications.maxPerSecond", "notifications.caFile",
            "costs.promptOverheadTokens", "costs.imageTokens", "costs.drainSeconds", "costs.toolOverheadTokens", "rate.leaseSeconds",
            "ledger.retentionMonths",
        ] + AppleSettings.keys
    static let secretKeys: Set<String> = [
        "database.url", "upstream.apiKey", "operator.token", "operator.tokens", "jwt.secret", "notifications.webhookSecret",
        "metrics.token",
    ]
    /// What `serve` and `check-config` say about `ledger.retentionMonths` when it is set: that
    /// months go only once exported, which an operator has to schedule.
    public var retentionNotice: String? {
        ledgerRetentionMonths.map {
            "ledger.retentionMonths is \($0): a month older than the current one and the \($0) before it is dropped from the "
                + "ledger once exported (capgate ledger export) and settled; a month not exported stays"
        }
    }
    /// Environment variables the SPEC names differently from the keys' own (`NOTIFICATIONS_…`).
    static let environmentAliases: [String: String] = [
        "NOTIFY_WEBHOOK_URL": "notifications.webhookUrl", "NOTIFY_WEBHOOK_SECRET": "notifications.webhookSecret",
        "NOTIFY_THRESHOLDS": "notifications.thresholds", "PROXY_MAX_JSON_DEPTH": "proxy.maxJSONDepth",
        "METRICS_TOKEN": "metrics.token", "METRICS_PUBLIC": "metrics.public", "JWT_MAX_LIFETIME": "jwt.maxLifetime",
        "NOTIFICATIONS_RETENTION_DAYS": "notifications.retentionDays",
        "HTTP_BODY_TIMEOUT": "http.bodyTimeout", "PROXY_COMPANY_SHARE": "proxy.companyShare",
        "APPLE_BUNDLE_ID": "apple.bundleId", "APPLE_APP_APPLE_ID": "apple.appAppleId",
        "APPLE_ROOT_CERTIFICATES": "apple.rootCertificates", "APPLE_ENVIRONMENTS": "apple.environments",
    ]

    /// An absolute `http://` or `https://` URL with a host.
    static func isHTTPURL(_ text: String) -> Bool {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), let host = url.host else { return false }
        return (scheme == "http" || scheme == "https") && !host.isEmpty
    }

    /// Reads and validates every key. Throws ``ConfigurationError`` naming the key on a bad value.
    public init(reader: ConfigReader) throws {
        host = reader.string(forKey: "http.host", default: "127.0.0.1")
        port = try Self.int(reader, "http.port", default: 8080, range: 0...65535)
        httpIdleTimeout = try Self.double(reader, "http.idleTimeout", default: 60)
        httpHeaderTimeout = try Self.double(reader, "http.headerTimeout", default: 10)
        httpBodyTimeout = try Self.double(reader, "http.bodyTimeout", default: 30)
        httpMaxConnections = try Self.int(reader, "http.maxConnections", default: 10_000, range: 1...1_000_000)
        // Only both-or-neither here: the files are read where they are served (``ListenerTLS``),
        // so `capgate migrate` or `verify` never needs to read the server's private key.
        httpTLS = try ListenerTLSFiles.pair(
            certificate: Self.nonEmpty(reader.string(forKey: "http.tls.certificate")),
            key: Self.nonEmpty(reader.string(forKey: "http.tls.key")))
        databaseURL = Self.nonEmpty(reader.string(forKey: "database.url", isSecret: true))
        databaseMaxConnections = try Self.int(reader, "database.maxConnections", default: 20, range: 1...1000)
        databaseTimeout = try Self.double(reader, "database.timeout", default: 5)
        databaseAdmissionQueueLimit = try Self.int(reader, "database.admissionQueueLimit", default: 10_000, range: 1...10_000_000)
        databaseDurability = reader.string(forKey: "database.durability", default: "durable")
        guard ["durable", "relaxed"].contains(databaseDurability) else {
            throw ConfigurationError(key: "database.durability", problem: "must be 'durable' or 'relaxed'")
        }
        upstreamURL = Self.nonEmpty(reader.string(forKey: "upstream.url"))
        upstreamAPIKey = Self.nonEmpty(reader.string(forKey: "upstream.apiKey", isSecret: true))
        upstreamTimeout = try Self.double(reader, "upstream.timeout", default: 600)
        upstreamConnectTimeout = try Self.double(reader, "upstream.connectTimeout", default: 10)
        upstreamIdleTimeout = try Self.double(reader, "upstream.idleTimeout", default: 300)
        upstreamMaxConnections = try Self.int(reader, "upstream.maxConnections", default: 512, range: 1...100_000)
        upstreamCAFile = Self.nonEmpty(reader.string(forKey: "upstream.caFile"))
        (operatorToken, operatorTokens) = try OperatorToken.configured(reader: reader)
        jwtSecret = Self.nonEmpty(reader.string(forKey: "jwt.secret", isSecret: true))
        jwtJWKSFile = Self.nonEmpty(reader.string(forKey: "jwt.jwksFile"))
        jwtCompanyClaim = reader.string(forKey: "jwt.companyClaim", default: "company_id")
        jwtFeatureClaim = Self.nonEmpty(reader.string(forKey: "jwt.featureClaim", default: "capgate_features"))
        jwtAudience = Self.nonEmpty(reader.string(forKey: "jwt.audience"))
        jwtIssuer = Self.nonEmpty(reader.string(forKey: "jwt.issuer"))
        jwtLeeway = try Self.int(reader, "jwt.leeway", default: 0, range: 0...3600)
        proxyPrefix = reader.string(forKey: "proxy.prefix", default: "/v1/")
        proxyMaxBodyBytes = try Self.int(reader, "proxy.maxBodyBytes", default: 32 << 20, range: 1...(1 << 34))
        proxyIdempotencyMaxBytes = try Self.int(reader, "proxy.idempotencyMaxBytes", default: 1 << 20, range: 0...(64 << 20))
        proxyBodyBudgetBytes = try Self.int(reader, "proxy.bodyBudgetBytes", default: 256 << 20, range: 1...(1 << 40))
        proxyCompanyShare = try Self.int(reader, "proxy.companyShare", default: 25, range: 1...100)
        proxyMaxJSONDepth = try Self.int(reader, "proxy.maxJSONDepth", default: JSONParser.defaultMaxDepth, range: 1...256)
        metricsToken = Self.nonEmpty(reader.string(forKey: "metrics.token", isSecret: true))
        metricsPublic = try Self.bool(reader, "metrics.public", default: false)
        let maxLifetime = try Self.int(reader, "jwt.maxLifetime", default: 0, range: 0...(86400 * 3660))
        jwtMaxLifetime = maxLifetime > 0 ? maxLifetime : nil
        billingRolloverInterval = try Self.int(reader, "billing.rolloverInterval", default: 0, range: 0...(86400 * 366))
        spoolDirectory = reader.string(forKey: "spool.directory", default: ".capgate/spool")
        costs = try CostSettings(reader: reader)
        apple = try AppleSettings(reader: reader)
        rateLeaseSeconds = try Self.int(reader, "rate.leaseSeconds", default: 600, range: 1...(86400 * 7))
        let retention = try Self.int(reader, "ledger.retentionMonths", default: 0, range: 0...1200)
        ledgerRetentionMonths = retention == 0 ? nil : retention
        logLevel = reader.string(forKey: "log.level", default: "info")
        notifications = try NotificationSettings(reader: reader)

        try validate()
    }

    /// The checks that read more than one key or a key's whole text.
    private func validate() throws {
        // A short HS256 secret can be guessed offline from one token (RFC 7518 §3.2 asks for a
        // key as long as the hash: 32 bytes).
        if let secret = jwtSecret, secret.utf8.count < 32 {
            throw ConfigurationError(
                key: "jwt.secret", problem: "is \(secret.utf8.count) bytes long; an HS256 secret must be at least 32 bytes")
        }
        if !proxyPrefix.hasPrefix("/") || !proxyPrefix.hasSuffix("/") {
            throw ConfigurationError(key: "proxy.prefix", problem: "must start and end with '/', such as /v1/")
        }
        if let url = upstreamURL, !Self.isHTTPURL(url) {
            throw ConfigurationError(key: "upstream.url", problem: "is not an absolute http(s) URL")
        }
        if let url = databaseURL, (try? DatabaseURL(url)) == nil {
            throw ConfigurationError(key: "database.url", problem: "is not a postgres://user:password@host:port/db URL")
        }
    }

    /// Throws the one-line error for a key that the command needs but nobody set.
    public func require(_ value: String?, key: String) throws -> String {
        guard let value else { throw ConfigurationError(key: key, problem: "is required") }
        return value
    }

    /// Loads configuration from flags (`key=value` pairs, highest), the environment, then the
    /// JSON file (`CAPGATE_CONFIG` or `config/capgate.json`, optional).
    /// Where the environment's variables are read: the SPEC's names that differ from the derived
    /// ones (`NOTIFY_WEBHOOK_URL`), then every key's derived name (`http.idleTimeout` →
    /// `HTTP_IDLE_TIMEOUT`).
    static func environmentProviders(_ environment: [String: String]) -> [any ConfigProvider] {
        var aliasValues: [AbsoluteConfigKey: ConfigValue] = [:]
        for (variable, key) in environmentAliases {
            guard let value = environment[variable] else { continue }
            aliasValues[AbsoluteConfigKey(ConfigKey(key))] = ConfigValue(.string(value), isSecret: secretKeys.contains(key))
        }
        let secretVariables: Set<String> = [
            "DATABASE_URL", "UPSTREAM_API_KEY", "OPERATOR_TOKEN", "OPERATOR_TOKENS", "JWT_SECRET", "NOTIFY_WEBHOOK_SECRET",
            "NOTIFICATIONS_WEBHOOK_SECRET", "METRICS_TOKEN",
        ]
        return [
            InMemoryProvider(name: "environment (SPEC names)", values: aliasValues),
            EnvironmentVariablesProvider(environmentVariables: environment, secretsSpecifier: .specific(secretVariables)),
        ]
    }

    /// The text `environment` gives `key`, read as ``load(flags:environment:file:)`` reads it
    /// (for checking a deployment's environment file).
    static func environmentValue(forKey key: String, environment: [String: String]) -> String? {
        ConfigReader(providers: environmentProviders(environment)).string(forKey: ConfigKey(key))
    }

    public static func load(
        flags: [String: String] = [:],
        environment: [String: String] = ProcessInfo.processInfo.environment,
        file: String? = nil
    ) async throws -> CapGateConfiguration {
        var providers: [any ConfigProvider] = []
        var flagValues: [AbsoluteConfigKey: ConfigValue] = [:]
        for (key, value) in flags {
            let secret = secretKeys.contains(key)
            if let int = Int(value) {
                flagValues[AbsoluteConfigKey(ConfigKey(key))] = ConfigValue(.int(int), isSecret: secret)
            } else {
                flagValues[AbsoluteConfigKey(ConfigKey(key))] = ConfigValue(.string(value), isSecret: secret)
            }
        }
        providers.append(InMemoryProvider(name: "flags", values: flagValues))
        providers += environmentProviders(environment)
        let path = file ?? environment["CAPGATE_CONFIG"] ?? "config/capgate.json"
        do {
            providers.append(try await FileProvider<JSONSnapshot>(filePath: FilePath(path), allowMissing: true))
        } catch {
            throw ConfigurationError(key: "config file", problem: "\(path) could not be read as JSON")
        }
        return try CapGateConfiguration(reader: ConfigReader(providers: providers))
    }

}
