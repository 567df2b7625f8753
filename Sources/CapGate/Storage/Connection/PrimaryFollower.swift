import Logging
import Metrics
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// The pool of a multi-host `database.url`: a `PostgresClient` for the host that accepts writes,
/// replaced by one for another host after a failover, without a restart.
///
/// ``Database/run(lateResult:_:)`` reports every failure that makes a call unavailable (a
/// connection error, a deadline, a read-only error from a standby, a server shutting down); the
/// follower then probes the hosts (``PrimaryLocator``), at most once every `probeInterval`, and
/// keeps probing at that pace while no host accepts writes. Calls meanwhile fail with
/// ``DatabaseError/unavailable`` (503: fail closed). When another host turns out writable, a
/// client for it is started and checked with a query; then calls use it, and the old client is
/// shut down once the calls that took it have ended (`database.timeout` later).
///
/// It is a service: its `run()` runs the current client (and each one that replaces it) and
/// ends them at graceful shutdown, as the single client of a single-host URL would.
public final class PrimaryFollower: Service, Sendable {
    private struct Current {
        var client: PostgresClient
        var index: Int
        var retire: AsyncStream<Void>.Continuation
    }

    public let url: DatabaseURL
    let maxConnections: Int
    let statementTimeout: Duration?
    let slotLeaseSeconds: Int?
    let probeInterval: Duration
    let logger: Logger
    private let current: Mutex<Current>
    private let initial: (client: PostgresClient, retire: AsyncStream<Void>)
    private let requests: AsyncStream<Void>
    private let requestContinuation: AsyncStream<Void>.Continuation

    /// - Parameters:
    ///   - initialHost: the index of the host found writable at start; nil when none was (the
    ///     follower starts on the first host and probes at once).
    ///   - probeInterval: the least time between two probes.
    public init(
        url: DatabaseURL, initialHost: Int?, maxConnections: Int, statementTimeout: Duration?, slotLeaseSeconds: Int? = nil,
        probeInterval: Duration = .milliseconds(500), logger: Logger
    ) {
        self.url = url
        self.maxConnections = maxConnections
        self.statementTimeout = statementTimeout
        self.slotLeaseSeconds = slotLeaseSeconds
        self.probeInterval = probeInterval
        self.logger = logger
        let index = initialHost ?? 0
        let client = Self.makeClient(
            url: url, index: index, maxConnections: maxConnections, statementTimeout: statementTimeout,
            slotLeaseSeconds: slotLeaseSeconds, logger: logger)
        let (retire, retireContinuation) = AsyncStream.makeStream(of: Void.self)
        self.initial = (client, retire)
        self.current = Mutex(Current(client: client, index: index, retire: retireContinuation))
        (requests, requestContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        if initialHost == nil { requestContinuation.yield() }
    }

    /// The client of the host believed writable.
    public var client: PostgresClient { current.withLock { $0.client } }

    /// The host the gateway uses now.
    public var currentHost: DatabaseURL.Endpoint { url.hosts[current.withLock { $0.index }] }

    /// A call failed as unavailable: the hosts are probed soon (at most once per interval).
    public func callFailed() {
        requestContinuation.yield()
    }

    public func run() async throws {
        let initial = self.initial
        await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { await Self.run(initial.client, until: initial.retire) }
                await self.follow(group: &group)
                group.cancelAll()
            }
        }
    }

    /// Probes the hosts after each reported failure, until one accepts writes, and moves to it.
    private func follow(group: inout DiscardingTaskGroup) async {
        let locator = PrimaryLocator(url: url, logger: logger)
        var lastProbe: ContinuousClock.Instant? = nil
        var lost = false
        for await _ in requests {
            while !Task.isCancelled {
                if let lastProbe { try? await Task.sleep(until: lastProbe + probeInterval) }
                lastProbe = .now
                let index = current.withLock { $0.index }
                guard let found = await locator.locate(preferring: index) else {
                    if !lost {
                        logger.error(
                            "no database host accepts writes; calls are refused (503) until one does",
                            metadata: ["hosts": "\(url.hosts)"])
                        lost = true
                    }
                    continue
                }
                if found != index {
                    guard await move(to: found, group: &group) else { continue }
                } else if lost {
                    logger.notice("the database host accepts writes again", metadata: ["host": "\(url.hosts[found])"])
                }
                lost = false
                break
            }
        }
    }

    /// Starts a client for host `index`, checks it with a query, and makes it the current one;
    /// false (and that client shut down) when the check fails.
    private func move(to index: Int, group: inout DiscardingTaskGroup) async -> Bool {
        let client = Self.makeClient(
            url: url, index: index, maxConnections: maxConnections, statementTimeout: statementTimeout,
            slotLeaseSeconds: slotLeaseSeconds, logger: logger)
        let (retire, retireContinuation) = AsyncStream.makeStream(of: Void.self)
        group.addTask { await Self.run(client, until: retire) }
        let logger = self.logger
        do {
            let writable = try await withDeadline(.seconds(3)) {
                var writable = false
                let rows = try await client.query("SELECT NOT pg_is_in_recovery()", logger: logger)
                for try await value in rows.decode(Bool.self) { writable = value }
                return writable
            }
            guard writable else { throw DatabaseError.unavailable }
        } catch {
            logger.warning(
                "the new database host failed its check; probing again",
                metadata: ["host": "\(url.hosts[index])", "error": "\(String(reflecting: error))"])
            retireContinuation.finish()
            return false
        }
        let old = current.withLock { current in
            let old = current
            current = Current(client: client, index: index, retire: retireContinuation)
            return old
        }
        // The old pool is closed once every call that took it has been answered (at
        // database.timeout) and every statement sent on it has ended on its server (the same
        // time, as statement_timeout): closing it at once would cut statements in flight.
        let grace = (statementTimeout ?? .seconds(5)) + .seconds(1)
        group.addTask {
            try? await Task.sleep(for: grace)
            old.retire.finish()
        }
        GatewayMetrics.databaseFailover()
        logger.warning(
            "database failover: calls now go to another host",
            metadata: ["from": "\(url.hosts[old.index])", "to": "\(url.hosts[index])"])
        return true
    }

    /// Runs `client` until `retire` finishes (or the task is cancelled), then shuts it down.
    private static func run(_ client: PostgresClient, until retire: AsyncStream<Void>) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            group.addTask { for await _ in retire {} }
            await group.next()
            group.cancelAll()
        }
    }

    private static func makeClient(
        url: DatabaseURL, index: Int, maxConnections: Int, statementTimeout: Duration?, slotLeaseSeconds: Int?, logger: Logger
    ) -> PostgresClient {
        PostgresClient(
            configuration: url.only(url.hosts[index]).clientConfiguration(
                maxConnections: maxConnections, statementTimeout: statementTimeout, slotLeaseSeconds: slotLeaseSeconds),
            backgroundLogger: logger)
    }
}

extension Database {
    /// The gateway's database for `url`, and the service that must run for it: for a
    /// single-host URL one `PostgresClient` (as before); for a multi-host URL a
    /// ``PrimaryFollower`` started on the host that accepts writes now (probed once, bounded).
    public static func connect(
        url: DatabaseURL, maxConnections: Int, timeout: Duration, slotLeaseSeconds: Int? = nil, logger: Logger
    ) async -> (database: Database, service: any Service) {
        guard url.isMultiHost else {
            let client = PostgresClient(
                configuration: url.clientConfiguration(
                    maxConnections: maxConnections, statementTimeout: timeout, slotLeaseSeconds: slotLeaseSeconds),
                backgroundLogger: logger)
            return (Database(client: client, timeout: timeout, logger: logger), client)
        }
        let initial = await PrimaryLocator(url: url, logger: logger).locate()
        if initial == nil {
            logger.error("no host of database.url accepts writes at start; calls are refused (503) until one does")
        }
        let follower = PrimaryFollower(
            url: url, initialHost: initial, maxConnections: maxConnections, statementTimeout: timeout,
            slotLeaseSeconds: slotLeaseSeconds, logger: logger)
        return (Database(follower: follower, timeout: timeout, logger: logger), follower)
    }
}

extension GatewayMetrics {
    private static let databaseFailovers: Metrics.Counter = {
        _ = registry
        return Metrics.Counter(label: "capgate_database_failovers_total")
    }()

    /// The gateway moved to another database host (`capgate_database_failovers_total`); 0: the
    /// counter appears at start.
    static func databaseFailover(by count: Int64 = 1) {
        databaseFailovers.increment(by: count)
    }
}
