import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// Delivers the notification rows the admissions write (SPEC §9) as signed webhooks, from
/// `capgate serve`, never on a request's path.
///
/// A worker takes one due row (`status = 'pending'`, `next_attempt_at` passed, a URL to send it
/// to) with `FOR UPDATE SKIP LOCKED` in a short transaction that leases it (its
/// `next_attempt_at` moved past the longest attempt, 3 × `notifications.timeout` + 5 s) and
/// commits; it POSTs with no transaction open, so a slow receiver holds no connection
/// admissions need. Another gateway does not take a leased row; a gateway killed mid-attempt
/// leaves it to be sent again when the lease ends (at least once; the receiver dedupes on
/// `webhook-id`). The outcome: 2xx `delivered`; anything else (timeout, connection refused,
/// 3xx-5xx) counts an attempt, records `last_error` and schedules the next with exponential
/// backoff and jitter, or marks the row `failed` once `notifications.retryFor` has passed since
/// it was written.
/// Admissions never wait on any of this: their inserts do not lock existing rows.
public struct NotificationDeliverer: Service {
    let database: Database
    let client: @Sendable () -> PostgresClient
    let settings: NotificationSettings
    let webhooks: WebhookClients
    let logger: Logger
    let pacer: DeliveryPacer

    /// Throws ``ConfigurationError`` when `notifications.caFile` holds no readable certificate.
    public init(database: Database, settings: NotificationSettings, configuration: CapGateConfiguration, logger: Logger) throws {
        self.database = database
        self.client = { database.client }
        self.settings = settings
        self.webhooks = try WebhookClients(configuration: configuration, timeout: settings.timeout)
        self.logger = logger
        self.pacer = DeliveryPacer(perSecond: settings.maxPerSecond)
    }

    public func run() async throws {
        do {
            try await Self.publishThresholds(settings.thresholds, database: database)
        } catch {
            logger.warning(
                "notifications.thresholds not written; admissions use the database's list",
                metadata: ["error": "\(String(reflecting: error))"])
        }
        guard settings.webhookSecret != nil else {
            logger.info("notifications are kept, not sent: notifications.webhookSecret is not set")
            try? await gracefulShutdown()
            return
        }
        let wake = WakeSignal()
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await listen(wake) }
            for _ in 0..<settings.workers {
                group.addTask {
                    while !Task.isShuttingDownGracefully && !Task.isCancelled {
                        while !Task.isCancelled, await pacer.take(), await deliverOne() {}
                        await wake.wait(upTo: .milliseconds(Int64(settings.pollInterval * 1000)))
                    }
                }
            }
            try? await gracefulShutdown()
            wake.stop()
            group.cancelAll()
        }
        await webhooks.shutdown()
    }

    /// LISTEN capgate_notifications: an admission that writes a row wakes the workers at commit.
    func listen(_ wake: WakeSignal) async {
        while !Task.isShuttingDownGracefully && !Task.isCancelled && !wake.stopped {
            do {
                try await client().withConnection { connection in
                    for try await _ in try await connection.listen("capgate_notifications") {
                        wake.signal()
                        if wake.stopped { break }
                    }
                }
            } catch {
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    struct Due: Sendable {
        var company: UUID
        var id: UUID
        var url: String
        var attempts: Int
        var createdAt: Date
        var payload: JSON
        /// The end of this worker's lease as PostgreSQL wrote it (exact epoch text): the fence of
        /// its outcome. A row leased again meanwhile has another, and a late failure changes nothing.
        var lease: String? = nil
    }

    /// How long a claimed row is left to its worker: longer than an attempt can last (connect,
    /// head, and a body read no longer than `timeout` after the POST began, each bounded by
    /// `notifications.timeout`), plus a margin.
    static func lease(_ settings: NotificationSettings) -> Double { 3 * settings.timeout + 5 }

    /// Takes one due row, sends it and records the outcome; false when nothing was due.
    ///
    /// The row is leased, not held: a short transaction claims it (`FOR UPDATE SKIP LOCKED`) and
    /// moves its `next_attempt_at` past the longest an attempt can take, and commits; the POST
    /// runs with no transaction open, so a slow receiver holds no database connection that
    /// admissions need. No other gateway takes the row while the lease runs; one that dies
    /// mid-attempt leaves it to be sent again when the lease ends (at least once, same
    /// `webhook-id`).
    func deliverOne() async -> Bool {
        do {
            let lease = Self.lease(settings)
            let claimed: Due? = try await client().withTransaction(logger: logger) { connection in
                guard var due = try await claim(connection) else { return nil }
                let rows = try await connection.query(
                    """
                    UPDATE notifications SET next_attempt_at = clock_timestamp() + make_interval(secs => \(lease))
                     WHERE company_id = \(due.company) AND id = \(due.id)
                    RETURNING extract(epoch FROM next_attempt_at)::text
                    """, logger: logger)
                for try await lease in rows.decode(String.self) { due.lease = lease }
                return due
            }
            guard let due = claimed else { return false }
            let outcome = await send(due)
            try await record(outcome, for: due)
            return true
        } catch {
            logger.warning("notification delivery could not reach the database", metadata: ["error": "\(String(reflecting: error))"])
            try? await Task.sleep(for: .seconds(1))
            return false
        }
    }

    func claim(_ connection: PostgresConnection) async throws -> Due? {
        let rows = try await connection.query(
            """
            SELECT \(unescaped: NotificationStore.payloadColumns), coalesce(c.webhook_url, \(settings.webhookURL)), n.attempts
              FROM \(unescaped: NotificationStore.payloadSource)
             WHERE n.status = 'pending' AND n.next_attempt_at <= clock_timestamp()
               AND coalesce(c.webhook_url, \(settings.webhookURL)) IS NOT NULL
             ORDER BY n.next_attempt_at
             LIMIT 1
               FOR UPDATE OF n SKIP LOCKED
            """, logger: logger)
        for try await row in rows {
            let cells = row.makeRandomAccess()
            let n = NotificationStore.payloadColumnCount
            return Due(
                company: try cells[0].decode(UUID.self), id: try cells[1].decode(UUID.self), url: try cells[n].decode(String.self),
                attempts: Int(try cells[n + 1].decode(Int32.self)), createdAt: try cells[2].decode(Date.self),
                payload: try NotificationStore.payload(row))
        }
        return nil
    }

    enum Outcome: Sendable {
        case delivered(status: Int)
        case failed(String)
    }

    func send(_ due: Due) async -> Outcome {
        guard let secret = settings.webhookSecret else { return .failed("no signing secret") }
        let id = due.id.uuidString.lowercased()
        let body = due.payload.byteBuffer()
        let timestamp = Int(Date().timeIntervalSince1970)
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "application/json")
        headers.add(name: "user-agent", value: "CapGate-Webhooks/1")
        headers.add(name: "webhook-id", value: id)
        headers.add(name: "webhook-timestamp", value: String(timestamp))
        headers.add(
            name: "webhook-signature",
            value: WebhookSignature.sign(id: id, timestamp: timestamp, body: Array(body.readableBytesView), secret: secret))
        let started = ContinuousClock.now
        let outcome: Outcome
        do {
            let status = try await webhooks.post(url: due.url, headers: headers, body: body)
            outcome = (200..<300).contains(status) ? .delivered(status: status) : .failed("HTTP \(status)")
        } catch {
            outcome = .failed(Self.describe(error))
        }
        var metadata: Logger.Metadata = [
            "notification_id": .string(id), "company_id": .string(due.company.uuidString.lowercased()),
            "attempt": "\(due.attempts + 1)", "duration_ms": "\((ContinuousClock.now - started).milliseconds)",
        ]
        switch outcome {
        case .delivered(let status):
            metadata["result"] = "delivered"
            metadata["status"] = "\(status)"
        case .failed(let reason):
            metadata["result"] = "failed"
            metadata["error"] = .string(reason)
        }
        logger.info("notification delivery attempt", metadata: metadata)
        GatewayMetrics.notificationAttempt(delivered: { if case .delivered = outcome { true } else { false } }())
        return outcome
    }

    /// Writes an attempt's outcome. A failure is recorded only while the row is still pending
    /// (a lease that ran out may have let another gateway deliver it meanwhile).
    func record(_ outcome: Outcome, for due: Due) async throws {
        let connection = client()
        switch outcome {
        case .delivered:
            try await connection.query(
                """
                UPDATE notifications SET status = 'delivered', attempts = attempts + 1, delivered_at = clock_timestamp(),
                       last_error = NULL
                 WHERE company_id = \(due.company) AND id = \(due.id)
                """, logger: logger)
        case .failed(let reason):
            let attempts = due.attempts + 1
            let giveUp = Date().timeIntervalSince(due.createdAt) >= settings.retryFor
            let delay = settings.delay(afterAttempts: attempts)
            try await connection.query(
                """
                UPDATE notifications
                   SET attempts = attempts + 1, last_error = \(String(reason.prefix(500))),
                       status = CASE WHEN \(giveUp) THEN 'failed' ELSE 'pending' END,
                       next_attempt_at = clock_timestamp() + make_interval(secs => \(delay))
                 WHERE company_id = \(due.company) AND id = \(due.id) AND status = 'pending'
                   AND extract(epoch FROM next_attempt_at)::text = \(due.lease)
                """, logger: logger)
        }
    }

    static func describe(_ error: any Error) -> String {
        if let upstream = error as? UpstreamError { return String(describing: upstream) }
        if let channel = error as? ChannelError { return "connection failed: \(channel)" }
        if let io = error as? IOError { return "connection failed: \(io.description)" }
        return String(describing: type(of: error))
    }
}

/// Spaces the attempts of all workers of a gateway at least `1 / perSecond` apart
/// (`notifications.maxPerSecond`): a backlog after a receiver outage is sent at that rate
/// instead of taking the CPU and connections that admissions share with it.
final class DeliveryPacer: Sendable {
    private let interval: Duration
    private let next = Mutex<ContinuousClock.Instant>(.now)

    init(perSecond: Double) {
        interval = .nanoseconds(Int64(1_000_000_000 / max(perSecond, 0.001)))
    }

    /// Waits for this worker's slot; true unless the task was cancelled meanwhile.
    func take() async -> Bool {
        let slot = next.withLock { next in
            let slot = max(next, ContinuousClock.now)
            next = slot + interval
            return slot
        }
        if slot > ContinuousClock.now { try? await Task.sleep(until: slot, clock: .continuous) }
        return !Task.isCancelled
    }
}

/// Wakes waiting workers early (a NOTIFY arrived) or lets them sleep out their poll interval.
final class WakeSignal: Sendable {
    private let state = Mutex<(generation: Int, stopped: Bool)>((0, false))

    var stopped: Bool { state.withLock { $0.stopped } }

    func signal() { state.withLock { $0.generation += 1 } }

    func stop() { state.withLock { $0.stopped = true } }

    /// Returns after `limit`, or sooner once signalled (checked every 20 ms: cheap and simple).
    func wait(upTo limit: Duration) async {
        let start = state.withLock { $0.generation }
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !Task.isCancelled {
            if state.withLock({ $0.generation != start || $0.stopped }) { return }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}

extension NotificationDeliverer {
    /// The outbox's numbers for `/metrics`: rows written, delivered, failed, waiting for a retry,
    /// and the age in seconds of the oldest pending row that has somewhere to go (the company's
    /// `webhook_url`, or `configuredURL`). Rows kept for lack of any URL wait by design and would
    /// otherwise make the age grow without end on a deployment that reads them through the API.
    static func outboxNumbers(
        database: Database, configuredURL: String?
    ) async throws -> (written: Int64, delivered: Int64, failed: Int64, retrying: Int64, oldestPendingSeconds: Double)? {
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT count(*)::bigint, count(*) FILTER (WHERE n.status = 'delivered')::bigint,
                       count(*) FILTER (WHERE n.status = 'failed')::bigint,
                       count(*) FILTER (WHERE n.status = 'pending' AND n.attempts > 0)::bigint,
                       coalesce(extract(epoch FROM clock_timestamp() - min(n.created_at) FILTER (
                           WHERE n.status = 'pending' AND coalesce(c.webhook_url, \(configuredURL)) IS NOT NULL)), 0)::float8
                  FROM notifications n JOIN companies c ON c.id = n.company_id
                """, logger: database.logger
            ).decode((Int64, Int64, Int64, Int64, Double).self).collect()
        }
        return rows.first.map { (written: $0.0, delivered: $0.1, failed: $0.2, retrying: $0.3, oldestPendingSeconds: $0.4) }
    }

    /// Reads ``outboxNumbers(database:configuredURL:)`` into `/metrics` (a periodic job of `capgate serve`).
    static func refreshMetrics(database: Database, configuredURL: String?) async {
        do {
            if let r = try await outboxNumbers(database: database, configuredURL: configuredURL) {
                GatewayMetrics.notificationOutbox(
                    written: r.written, delivered: r.delivered, failed: r.failed, retrying: r.retrying,
                    oldestPendingSeconds: r.oldestPendingSeconds)
            }
        } catch {
            database.logger.debug("notification metrics not read", metadata: ["error": "\(String(reflecting: error))"])
        }
    }

    /// Writes `notifications.thresholds` where every admission reads them (one list per database).
    static func publishThresholds(_ thresholds: [Int], database: Database) async throws {
        let values = thresholds.map(Int32.init)
        try await database.write { connection in
            _ = try await connection.query(
                "UPDATE config_versions SET thresholds = \(values) WHERE singleton AND thresholds IS DISTINCT FROM \(values)",
                logger: database.logger
            ).collect()
        }
    }
}
