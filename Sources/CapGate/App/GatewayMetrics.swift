import Metrics
import Prometheus
import Synchronization

/// CapGate's Prometheus metrics, through swift-metrics with the swift-prometheus backend.
///
/// The metrics system can be bootstrapped once per process, so every application in a process
/// (the tests start several) shares one registry.
public enum GatewayMetrics {
    /// The process-wide registry, bootstrapped on first use.
    public static let registry: PrometheusCollectorRegistry = {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = [
            .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
            .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
            .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10), .seconds(30), .seconds(60),
        ]
        factory.defaultValueHistogramBuckets = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        MetricsSystem.bootstrap(factory)
        return registry
    }()

    /// Prometheus text of every metric.
    public static func exposition() -> [UInt8] {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }

    /// Metric handles by their dimensions, made once: creating a handle goes through the
    /// factory and the registry's lock for every call otherwise.
    private static let handles = Mutex(Handles())

    private struct Handles {
        var requests: [RequestKey: Metrics.Counter] = [:]
        var admissions: [String: Metrics.Timer] = [:]
        var upstreams: [Int: Metrics.Timer] = [:]
        var refunds: [String: Metrics.Counter] = [:]
    }

    /// The handle stored under `key` in one of the caches, made by `make` the first time.
    private static func cached<Key: Hashable, Handle: Sendable>(
        _ cache: WritableKeyPath<Handles, [Key: Handle]>, _ key: Key, make: () -> Handle
    ) -> Handle {
        _ = registry
        return handles.withLock { handles in
            if let handle = handles[keyPath: cache][key] { return handle }
            let handle = make()
            handles[keyPath: cache][key] = handle
            return handle
        }
    }

    private struct RequestKey: Hashable {
        var route: String
        var status: Int
        var decision: String
    }

    private static let inflightRequests: Meter = registered { Meter(label: "capgate_inflight_requests") }

    private static let admissionBatchSize: Recorder = registered { Recorder(label: "capgate_admission_batch_size") }

    private static let admissionBatchDuration: Metrics.Timer = registered {
        Metrics.Timer(label: "capgate_admission_batch_duration_seconds")
    }

    static func request(route: String, status: Int, decision: String) {
        cached(\.requests, RequestKey(route: route, status: status, decision: decision)) {
            Metrics.Counter(
                label: "capgate_requests_total", dimensions: [("route", route), ("status", String(status)), ("decision", decision)])
        }.increment()
    }

    static func admission(_ duration: Duration, decision: String) {
        cached(\.admissions, decision) {
            Metrics.Timer(label: "capgate_admission_duration_seconds", dimensions: [("decision", decision)])
        }.recordNanoseconds(duration.nanoseconds)
    }

    /// Calls admitted by one admission transaction (batching).
    static func admissionBatch(size: Int) {
        admissionBatchSize.record(size)
    }

    /// How long one admission transaction took, seen from the gateway (send to last row).
    static func admissionBatch(duration: Duration) {
        admissionBatchDuration.recordNanoseconds(duration.nanoseconds)
    }

    static func upstream(_ duration: Duration, status: Int) {
        let statusClass = status / 100
        cached(\.upstreams, statusClass) {
            Metrics.Timer(label: "capgate_upstream_duration_seconds", dimensions: [("status_class", "\(statusClass)xx")])
        }.recordNanoseconds(duration.nanoseconds)
    }

    static func refund(reason: RefundReason) {
        cached(\.refunds, reason.rawValue) {
            Metrics.Counter(label: "capgate_refunds_total", dimensions: [("reason", reason.rawValue)])
        }.increment()
    }

    private static let costOverHoldCounter: Metrics.Counter = registered {
        Metrics.Counter(label: "capgate_cost_over_hold_total")
    }

    /// A settled call cost more than its hold (SPEC §11).
    static func costOverHold() {
        costOverHoldCounter.increment()
    }

    /// A handle made after the factory is bootstrapped (the registry first).
    private static func registered<Handle>(_ make: () -> Handle) -> Handle {
        _ = registry
        return make()
    }

    static func inflight(_ delta: Int) {
        add(delta, to: inflightRequests)
    }

    private static func add(_ delta: Int, to meter: Meter) {
        if delta > 0 { meter.increment(by: Double(delta)) } else { meter.decrement(by: Double(-delta)) }
    }

    private static let databaseInFlight: Meter = registered { Meter(label: "capgate_db_operations_in_flight") }

    private static let databaseUnavailable: Metrics.Counter = registered { Metrics.Counter(label: "capgate_db_unavailable_total") }

    /// Pool state beside the pool's size: database operations holding (or waiting for) a
    /// connection now, and how many found PostgreSQL unavailable.
    static func databaseOperation(_ delta: Int) {
        add(delta, to: databaseInFlight)
    }

    static func databaseUnavailableOnce() {
        databaseUnavailable.increment()
    }

    private static let spool: Metrics.Gauge = registered { Metrics.Gauge(label: "capgate_spool_depth") }

    /// Writes waiting in the local spool for the database (``Spool``).
    static func spoolDepth(_ depth: Int) {
        spool.record(depth)
    }

    private static let notificationsDelivered: Metrics.Counter = registered {
        Metrics.Counter(label: "capgate_notification_attempts_total", dimensions: [("result", "delivered")])
    }

    private static let notificationsFailed: Metrics.Counter = registered {
        Metrics.Counter(label: "capgate_notification_attempts_total", dimensions: [("result", "failed")])
    }

    /// One webhook attempt of this gateway (SPEC §9), by result.
    static func notificationAttempt(delivered: Bool) {
        (delivered ? notificationsDelivered : notificationsFailed).increment()
    }

    /// The outbox as the database holds it (every gateway reports the same numbers): rows written,
    /// delivered and failed, rows waiting for a retry, and the age of the oldest pending one.
    static func notificationOutbox(written: Int64, delivered: Int64, failed: Int64, retrying: Int64, oldestPendingSeconds: Double) {
        _ = registry
        Gauge(label: "capgate_notifications_written").record(written)
        Gauge(label: "capgate_notifications_delivered").record(delivered)
        Gauge(label: "capgate_notifications_failed").record(failed)
        Gauge(label: "capgate_notifications_retry_backlog").record(retrying)
        Gauge(label: "capgate_notifications_oldest_pending_seconds").record(oldestPendingSeconds)
    }

    static func pool(maxConnections: Int) {
        _ = registry
        Gauge(label: "capgate_db_pool_max_connections").record(maxConnections)
        databaseOperation(0)  // both appear before the first operation
        databaseUnavailable.increment(by: 0)
        // Counters an alert divides or watches appear at 0 before their first event, so a rule
        // over them has a series to read from the start.
        notificationsDelivered.increment(by: 0)
        notificationsFailed.increment(by: 0)
        databaseFailover(by: 0)
        costOverHoldCounter.increment(by: 0)
    }

    private static let writable: Metrics.Gauge = registered { Metrics.Gauge(label: "capgate_db_writable") }

    /// 1 when the database this gateway uses passed its writable check (a host neither in
    /// recovery nor read-only answered within `database.timeout`), 0 when it did not
    /// (``Database/acceptsWrites()``).
    static func databaseWritable(_ yes: Bool) {
        writable.record(yes ? 1 : 0)
    }

    private static let unsettledCharges: Metrics.Gauge = registered { Metrics.Gauge(label: "capgate_unsettled_charges") }

    private static let unsettledOldest: Metrics.Gauge = registered { Metrics.Gauge(label: "capgate_unsettled_oldest_seconds") }

    /// The ledger's charges left without a settlement past ``UnsettledCharges/defaultGrace``, and
    /// the age of the oldest in seconds (0: none), as the database holds them (every gateway
    /// reports the same numbers).
    static func unsettled(count: Int64, oldestSeconds: Double) {
        unsettledCharges.record(count)
        unsettledOldest.record(oldestSeconds)
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
    var milliseconds: Double { Double(nanoseconds) / 1_000_000 }
}
