import Configuration
import Foundation
import SystemPackage

/// CapGate's whole configuration, read once at start from (highest first) command-line flags,
/// environment variables, `config/capgate.json`, then the defaults documented on each key.
public struct CapGateConfiguration: Sendable {
    /// `http.*`: the listener (``HTTPSettings``).
    public var http: HTTPSettings
    /// `database.*`: the PostgreSQL calls are charged in (``DatabaseSettings``).
    public var database: DatabaseSettings
    /// `upstream.*`: the provider (``UpstreamSettings``).
    public var upstream: UpstreamSettings
    /// `operator.*`: the operator API's tokens (``OperatorSettings``).
    public var operators: OperatorSettings
    /// `jwt.*`: end-user tokens (``JWTSettings``).
    public var jwt: JWTSettings
    /// `proxy.*`: what is forwarded and how bodies are read (``ProxySettings``).
    public var proxy: ProxySettings
    /// `metrics.*`: who may read `/metrics` (``MetricsSettings``).
    public var metrics: MetricsSettings
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

    /// Every key CapGate reads, with its environment variable (used by docs and `--help`): each
    /// part's, and the keys read here.
    public static let keys: [String] =
        HTTPSettings.keys + DatabaseSettings.keys + UpstreamSettings.keys + OperatorSettings.keys + JWTSettings.keys
        + ProxySettings.keys + MetricsSettings.keys + NotificationSettings.keys + CostSettings.keys + AppleSettings.keys
        + ["billing.rolloverInterval", "spool.directory", "log.level", "rate.leaseSeconds", "ledger.retentionMonths"]
    /// The keys whose values are secrets: never printed, and their environment variables read as secrets.
    static let secretKeys: Set<String> =
        DatabaseSettings.secretKeys.union(UpstreamSettings.secretKeys).union(OperatorSettings.secretKeys)
        .union(JWTSettings.secretKeys).union(MetricsSettings.secretKeys).union(NotificationSettings.secretKeys)
    /// What `serve` and `check-config` say about `ledger.retentionMonths` when it is set: that
    /// months go only once exported, which an operator has to schedule.
    public var retentionNotice: String? {
        ledgerRetentionMonths.map {
            "ledger.retentionMonths is \($0): a month older than the current one and the \($0) before it is dropped from the "
                + "ledger once exported (capgate ledger export) and settled; a month not exported stays"
        }
    }
    /// The environment variables of the secret keys: each key's derived name, and the SPEC's name
    /// where it differs (`NOTIFY_WEBHOOK_SECRET`).
    static let secretVariables = Set(
        secretKeys.map(ConfigurationError.derivedEnvironmentName(of:))
            + environmentAliases.filter { secretKeys.contains($0.value) }.map(\.key))
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
        http = try HTTPSettings(reader: reader)
        database = try DatabaseSettings(reader: reader)
        upstream = try UpstreamSettings(reader: reader)
        operators = try OperatorSettings(reader: reader)
        jwt = try JWTSettings(reader: reader)
        proxy = try ProxySettings(reader: reader)
        metrics = try MetricsSettings(reader: reader)
        billingRolloverInterval = try Self.int(reader, "billing.rolloverInterval", default: 0, range: 0...(86400 * 366))
        spoolDirectory = reader.string(forKey: "spool.directory", default: ".capgate/spool")
        costs = try CostSettings(reader: reader)
        apple = try AppleSettings(reader: reader)
        rateLeaseSeconds = try Self.int(reader, "rate.leaseSeconds", default: 600, range: 1...(86400 * 7))
        let retention = try Self.int(reader, "ledger.retentionMonths", default: 0, range: 0...1200)
        ledgerRetentionMonths = retention == 0 ? nil : retention
        logLevel = reader.string(forKey: "log.level", default: "info")
        notifications = try NotificationSettings(reader: reader)

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
