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

    static func request(route: String, status: Int, decision: String) {
        _ = registry
        Counter(label: "capgate_requests_total", dimensions: [("route", route), ("status", String(status)), ("decision", decision)])
            .increment()
    }

    static func admission(_ duration: Duration, decision: String) {
        _ = registry
        Metrics.Timer(label: "capgate_admission_duration_seconds", dimensions: [("decision", decision)]).recordNanoseconds(
            duration.nanoseconds)
    }

    /// Calls admitted by one admission transaction (batching).
    static func admissionBatch(size: Int) {
        _ = registry
        Recorder(label: "capgate_admission_batch_size").record(size)
    }

    static func upstream(_ duration: Duration, status: Int) {
        _ = registry
        Metrics.Timer(label: "capgate_upstream_duration_seconds", dimensions: [("status_class", "\(status / 100)xx")]).recordNanoseconds(
            duration.nanoseconds)
    }

    static func refund(reason: String) {
        _ = registry
        Counter(label: "capgate_refunds_total", dimensions: [("reason", reason)]).increment()
    }

    static func inflight(_ delta: Int) {
        _ = registry
        let gauge = Meter(label: "capgate_inflight_requests")
        if delta > 0 { gauge.increment(by: Double(delta)) } else { gauge.decrement(by: Double(-delta)) }
    }

    static func pool(maxConnections: Int) {
        _ = registry
        Gauge(label: "capgate_db_pool_max_connections").record(maxConnections)
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
    var milliseconds: Double { Double(nanoseconds) / 1_000_000 }
}
