import Configuration
import Foundation

/// How threshold notifications are delivered (SPEC §9): the `notifications.*` keys.
public struct NotificationSettings: Sendable {
    /// `notifications.webhookUrl` / `NOTIFY_WEBHOOK_URL`: where a company without its own
    /// `webhook_url` is notified; nil: such rows are kept (readable through the API), not sent.
    public var webhookURL: String?
    /// `notifications.webhookSecret` / `NOTIFY_WEBHOOK_SECRET` (secret): the signing secret; nil:
    /// nothing is sent (an unsigned webhook could not be trusted by its receiver).
    public var webhookSecret: String?
    /// `notifications.thresholds` (default `[80, 100]`): percentages of a limit, 1-100.
    public var thresholds: [Int]
    /// `notifications.timeout` (seconds, default `10`): one attempt, connecting included.
    public var timeout: Double
    /// `notifications.retryFor` (seconds, default `86400`): a row is retried at least this long
    /// after it was written, then marked `failed`.
    public var retryFor: Double
    /// `notifications.retryDelay` (seconds, default `5`): the first retry's delay; each next one
    /// doubles, with ±20 % jitter, up to `notifications.maxRetryDelay` (default `900`).
    public var retryDelay: Double
    public var maxRetryDelay: Double
    /// `notifications.pollInterval` (seconds, default `1`): how often due rows are looked for when
    /// no admission woke the deliverer (a new row wakes it at once through LISTEN/NOTIFY).
    public var pollInterval: Double
    /// `notifications.maxPerSecond` (default `50`): the most delivery attempts a gateway starts
    /// in a second, so a backlog (after a receiver outage) drains beside the admissions instead
    /// of competing with them.
    public var maxPerSecond: Double = 50
    /// `notifications.retentionDays` / `NOTIFICATIONS_RETENTION_DAYS` (default `90`): delivered and
    /// failed rows older than this are purged.
    public var retentionDays: Int = 90
    /// `notifications.caFile` / `NOTIFICATIONS_CA_FILE`: a PEM file of trust roots for `https`
    /// receivers, used instead of the system's roots. Unset: the system's roots. Separate from
    /// `upstream.caFile`: receivers are the tenants' servers, not the provider, and a private root
    /// for one should not replace the public roots the other needs.
    public var caFile: String? = nil
    /// Deliveries in flight at once per gateway.
    public var workers = 4

    /// The delay before attempt `attempts + 1` after `attempts` failed ones.
    func delay(afterAttempts attempts: Int) -> Double {
        let base = min(maxRetryDelay, retryDelay * pow(2, Double(max(0, attempts - 1))))
        return base * Double.random(in: 0.8...1.2)
    }
}

extension NotificationSettings {
    static let keys = [
        "notifications.webhookUrl", "notifications.webhookSecret", "notifications.thresholds", "notifications.timeout",
        "notifications.retryFor", "notifications.retryDelay", "notifications.maxRetryDelay", "notifications.pollInterval",
        "notifications.maxPerSecond", "notifications.retentionDays", "notifications.caFile",
    ]
    static let secretKeys: Set<String> = ["notifications.webhookSecret"]

    /// Reads and validates the `notifications.*` keys.
    init(reader: ConfigReader) throws {
        self.init(
            webhookURL: CapGateConfiguration.nonEmpty(reader.string(forKey: "notifications.webhookUrl")),
            webhookSecret: CapGateConfiguration.nonEmpty(reader.string(forKey: "notifications.webhookSecret", isSecret: true)),
            thresholds: try CapGateConfiguration.thresholds(reader),
            timeout: try CapGateConfiguration.double(reader, "notifications.timeout", default: 10),
            retryFor: try CapGateConfiguration.double(reader, "notifications.retryFor", default: 86400),
            retryDelay: try CapGateConfiguration.double(reader, "notifications.retryDelay", default: 5),
            maxRetryDelay: try CapGateConfiguration.double(reader, "notifications.maxRetryDelay", default: 900),
            pollInterval: try CapGateConfiguration.double(reader, "notifications.pollInterval", default: 1),
            maxPerSecond: try CapGateConfiguration.double(reader, "notifications.maxPerSecond", default: 50),
            retentionDays: try CapGateConfiguration.int(reader, "notifications.retentionDays", default: 90, range: 1...36600),
            caFile: CapGateConfiguration.nonEmpty(reader.string(forKey: "notifications.caFile"))
        )
        if let url = webhookURL, !CapGateConfiguration.isHTTPURL(url) {
            throw ConfigurationError(key: "notifications.webhookUrl", problem: "is not an absolute http(s) URL")
        }
    }
}
