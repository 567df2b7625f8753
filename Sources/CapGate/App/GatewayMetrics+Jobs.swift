import Logging
import ServiceLifecycle

extension GatewayMetrics {
    /// The periodic jobs that read into `/metrics` what only the database knows: the notification
    /// outbox (every 10 s), whether the database accepts writes (every 10 s), and the charges left
    /// unsettled past the grace time (every minute: found through the ledger's rollups, it reads
    /// only the quarter hours that hold one). Each runs at
    /// once at start, then after each interval; none runs on a request's path.
    static func refreshJobs(database: Database, configuration: CapGateConfiguration) -> [any Service] {
        let webhookURL = configuration.notifications.webhookURL
        let unsettled = UnsettledCharges(database: database)
        return [
            PeriodicJob(interval: .seconds(10)) {
                await NotificationDeliverer.refreshMetrics(database: database, configuredURL: webhookURL)
            },
            PeriodicJob(interval: .seconds(10)) {
                databaseWritable(await database.acceptsWrites())
            },
            PeriodicJob(interval: .seconds(60)) {
                do {
                    let totals = try await unsettled.totals()
                    GatewayMetrics.unsettled(count: totals.count, oldestSeconds: totals.oldestSeconds)
                } catch {
                    // The database unavailable or slower than database.timeout: the gauges keep
                    // their last numbers; `capgate verify` reports the same charges.
                    database.logger.warning(
                        "unsettled charges not counted for /metrics", metadata: ["error": "\(String(reflecting: error))"])
                }
            },
        ]
    }
}
