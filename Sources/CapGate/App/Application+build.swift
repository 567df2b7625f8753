import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import ServiceLifecycle

/// Builds the gateway: PostgreSQL pool, upstream client, stores, router and services.
///
/// `configuration.database.url` and `configuration.upstream.url` must be set (the `serve`
/// command checks; `dev` fills them with the embedded database and mock provider).
public func buildApplication(
    configuration: CapGateConfiguration,
    logger: Logger,
    onServerRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
) async throws -> some ApplicationProtocol {
    let parts = try await GatewayParts(configuration: configuration, logger: logger)
    if let tls = parts.tls { logger.info("serving HTTPS", metadata: tls.servedMetadata) }
    return Application(
        router: parts.router,
        server: configuration.http.httpServer(tls: parts.tls),
        configuration: configuration.http.serverConfiguration(logger: logger),
        services: parts.services + [await ListenerTLSReloader.make(tls: parts.tls, logger: logger)],
        onServerRunning: onServerRunning,
        eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton),
        logger: logger
    )
}

/// Everything the gateway is made of, before it runs.
struct GatewayParts {
    let router: Router<GatewayContext>
    let services: [any Service]
    let upstream: UpstreamClient
    /// The listener's TLS when `http.tls.*` are set.
    let tls: ListenerTLS?

    /// `stores`: the read routes' and authentication's stores; nil: PostgreSQL's (the router
    /// tests pass in-memory ones).
    init(configuration: CapGateConfiguration, logger: Logger, stores: GatewayStores? = nil) async throws {
        // First: a bad certificate or key stops the start before anything connects.
        self.tls = try configuration.http.tls.map { try ListenerTLS(files: $0) }
        let databaseURL = try DatabaseURL(try configuration.require(configuration.database.url, key: "database.url"))
        let upstreamURL = try configuration.require(configuration.upstream.url, key: "upstream.url")
        // A short operator token stops the start (SPEC §7), here too for a configuration changed
        // after it was read (`capgate dev` sets the demo's token).
        if let problem = OperatorToken.lengthProblem(
            operatorToken: configuration.operators.token, operatorTokens: configuration.operators.tokens)
        {
            throw problem
        }
        let group = MultiThreadedEventLoopGroup.singleton

        var dbLogger = logger
        dbLogger[metadataKey: "component"] = "database"
        let timeout = Duration.milliseconds(Int64(configuration.database.timeout * 1000))
        // One PostgresClient for a single-host URL; for a multi-host one, a follower that runs
        // the writable host's client and moves to another host after a failover.
        let (database, client) = await Database.connect(
            url: databaseURL, maxConnections: configuration.database.maxConnections, timeout: timeout,
            slotLeaseSeconds: configuration.rateLeaseSeconds, logger: dbLogger)
        let upstream = try UpstreamClient(configuration: configuration, baseURL: upstreamURL, eventLoopGroup: group)
        let keyUsage = KeyUsage(database: database)
        let stores = stores ?? .postgres(database)
        let authenticator = try await Authenticator(credentials: stores.credentials, configuration: configuration, keyUsage: keyUsage)
        let spool = try Self.spool(configuration: configuration, databaseURL: databaseURL, logger: dbLogger)
        let metering = MeteringStore(
            database: database, relaxed: configuration.database.durability == "relaxed",
            admissionQueueLimit: configuration.database.admissionQueueLimit, spool: spool)
        let billing = BillingStore(database: database)
        GatewayMetrics.pool(maxConnections: configuration.database.maxConnections)

        let proxy = ProxyHandler(
            authenticator: authenticator, metering: metering, upstream: upstream, knownKeys: KnownKeys(database: database, usage: keyUsage),
            routes: RouteTable(database: database), maxBodyBytes: configuration.proxy.maxBodyBytes,
            bodyBudget: BodyBudget(limit: configuration.proxy.bodyBudgetBytes),
            idempotencyMaxBytes: configuration.proxy.idempotencyMaxBytes, maxJSONDepth: configuration.proxy.maxJSONDepth,
            companySharePercent: configuration.proxy.companyShare, costs: configuration.costs
        )
        self.router = buildRouter(
            GatewayServices(
                proxyPrefix: configuration.proxy.prefix, proxy: proxy, authenticator: authenticator, database: database,
                migrator: Migrator(), metering: metering, tenants: TenantStore(database: database),
                periods: PeriodStore(database: database), usage: UsageStore(database: database), stores: stores, billing: billing,
                prices: PriceStore(database: database), apple: try AppleSignedData(settings: configuration.apple, logger: logger),
                metricsAccess: MetricsAccess(configuration: configuration), authFailures: FailedAuthThrottle()))
        // Shut down in reverse: the server drains first, then queued settlements are written,
        // then the upstream client closes, the spool is replayed a last time, and the pool closes.
        var services: [any Service] = [
            client, SpoolReplayer(spool: spool, database: database, interval: .seconds(2)),
            ClosingService(name: "upstream-client") { try await upstream.shutdown() },
            ClosingService(name: "settlements") { await metering.flush() },
        ]
        services += try Self.jobs(
            configuration: configuration, database: database, metering: metering, keyUsage: keyUsage, billing: billing, logger: logger)
        self.services = services
        self.upstream = upstream
    }

    /// The spool's entries name their database by user and name (not host: a failover keeps them).
    static func spool(configuration: CapGateConfiguration, databaseURL: DatabaseURL, logger: Logger) throws -> Spool {
        do {
            return try Spool(
                directory: configuration.spoolDirectory, database: "\(databaseURL.username)@\(databaseURL.database)", logger: logger)
        } catch {
            throw ConfigurationError(
                key: "spool.directory", problem: "names a folder that cannot be created or read: \(configuration.spoolDirectory)")
        }
    }

    /// The gateway's periodic work beside the calls: purges, flushes, lease renewal,
    /// notifications, metrics refreshes, the ledger's partitions, the rollover.
    static func jobs(
        configuration: CapGateConfiguration, database: Database, metering: MeteringStore, keyUsage: KeyUsage, billing: BillingStore,
        logger: Logger
    ) throws -> [any Service] {
        var jobs: [any Service] = []
        jobs.append(metering.idempotencyPurgeJob(interval: .seconds(600), logger: logger))
        // API keys' last_used_at (SPEC §13): noted in memory by each call, written here; the
        // UPDATE itself skips a key written less than a minute ago.
        jobs.append(keyUsage.flushJob(interval: .seconds(5), logger: logger))
        // Rate windows (SPEC §14): the leases of this gateway's calls in flight renewed every
        // quarter lease (a stream longer than the lease keeps its slot); rate.leaseSeconds where
        // every admission reads it, at start; then hourly, the calls a dead gateway never ended
        // are purged once their lease is over.
        let lease = configuration.rateLeaseSeconds
        jobs.append(
            PeriodicJob(interval: .milliseconds(max(250, lease * 250))) {
                await metering.renewSlotLeases(seconds: lease)
            })
        jobs.append(
            PeriodicJob(interval: .seconds(3600)) {
                do {
                    try await metering.setSlotLease(seconds: lease)
                    try await metering.purgeRateCalls()
                } catch {
                    logger.warning("rate.leaseSeconds not written; admissions use the database's", metadata: ["error": "\(error)"])
                }
            })
        // Threshold notifications (SPEC §9): the thresholds for every admission and the deliverer.
        var notificationLogger = logger
        notificationLogger[metadataKey: "component"] = "notifications"
        jobs.append(
            try NotificationDeliverer(
                database: database, settings: configuration.notifications, configuration: configuration, logger: notificationLogger))
        // What /metrics shows of the database: the outbox's numbers, writable or not, unsettled charges.
        jobs += GatewayMetrics.refreshJobs(database: database, configuration: configuration)
        let retentionDays = configuration.notifications.retentionDays
        jobs.append(
            PeriodicJob(interval: .seconds(3600)) {
                _ = try? await NotificationStore(database: database).purge(olderThanDays: retentionDays)
            })
        // The ledger's months (docs/ledger.md): the current one and two ahead, at start and hourly;
        // with ledger.retentionMonths, the months past it dropped once exported and settled.
        jobs.append(
            LedgerPartitions(database: database).job(
                interval: .seconds(3600), retention: configuration.ledgerRetentionMonths, logger: logger))
        // The ledger's rollups (docs/ledger.md#rollups): the changes the ledger's triggers wrote
        // moved into the rollups every 5 seconds, so a read sums few rows.
        jobs.append(LedgerRollups(database: database).job(interval: .seconds(5), logger: logger))
        if configuration.billingRolloverInterval > 0 {
            jobs.append(billing.rolloverJob(interval: .seconds(configuration.billingRolloverInterval), logger: logger))
        }
        return jobs
    }
}

/// The router: health and metrics, the client usage routes, the admin API; the proxy prefix
/// is handled by ``GatewayMiddleware`` in front of it.
func buildRouter(_ services: GatewayServices) -> Router<GatewayContext> {
    let database = services.database
    let authenticator = services.authenticator
    let authFailures = services.authFailures
    let router = Router(context: GatewayContext.self)
    let ownPaths: Set<String> = [
        "/v1/usage", "/v1/usage/check", "/v1/billing/apple/transactions", "/healthz", "/readyz", "/metrics", "/openapi.yaml",
    ]
    let methods = RouteMethods()
    router.add(middleware: GatewayMiddleware(proxy: services.proxy, prefix: services.proxyPrefix, ownPaths: ownPaths, methods: methods))

    registerOperational(on: router, services)

    let apple = AppleRoutes(signed: services.apple, store: AppleStore(billing: services.billing))
    apple.registerNotifications(on: router)

    let console = ConsoleRoutes(daily: services.stores.daily, companies: services.stores.companies)
    console.registerPage(on: router)
    let usageRoutes = UsageRoutes(
        metering: services.metering, usage: services.stores.usage, checks: services.usage, companies: services.stores.companies)
    let client = router.group("v1").add(middleware: AuthMiddleware(authenticator: services.authenticator)).group(
        context: AuthenticatedContext.self)
    usageRoutes.registerClient(on: client)
    apple.registerTransactions(on: client)

    let admin = router.group("admin/v1").add(middleware: AuthMiddleware(authenticator: authenticator, failures: authFailures))
        .group(context: AuthenticatedContext.self)
    OperatorRoutes(tenants: services.tenants, periods: services.periods).register(on: admin)
    usageRoutes.registerAdmin(on: admin)
    BillingRoutes(billing: services.billing).register(on: admin)
    apple.registerAdmin(on: admin)
    PriceRoutes(prices: services.prices).register(on: admin)
    AuditRoutes(audit: services.stores.audit, companies: services.stores.companies).register(on: admin)
    FeatureRoutes(features: FeatureStore(database: services.tenants.database), prefix: services.proxyPrefix).register(on: admin)
    console.register(on: admin)
    NotificationRoutes(notifications: services.stores.notifications, companies: services.stores.companies).register(on: admin)
    methods.record(router)
    return router
}

/// `/healthz`, `/readyz`, `/metrics` and `/openapi.yaml`.
func registerOperational(on router: Router<GatewayContext>, _ services: GatewayServices) {
    // What the route closures capture.
    let database = services.database
    let migrator = services.migrator
    let metricsAccess = services.metricsAccess
    let authenticator = services.authenticator
    let authFailures = services.authFailures
    router.get("/healthz") { _, _ in
        jsonResponse(.obj(["status": "ok"]))
    }
    router.get("/readyz") { _, _ in
        do {
            let pending = try await database.run { client in
                try await migrator.pending(client: client, logger: database.logger).count
            }
            guard pending == 0 else {
                return notReady(
                    "migrations_pending", "\(pending) database migration(s) not applied yet: run capgate migrate.",
                    extra: [.init("pending", .int(Int64(pending)))])
            }
            return jsonResponse(.obj(["status": "ready"]))
        } catch {
            return notReady("database_unreachable", "PostgreSQL cannot be reached; calls are refused until it is back.")
        }
    }
    router.get("/metrics") { request, context in
        do {
            try metricsAccess.check(request.headers)
        } catch let error as GatewayError {
            // A valid credential that may not read them (a user's or an admin's key or token) is
            // 403 (SPEC §3: authenticated, but not allowed); anything else is a failed
            // authentication: its 401, or past the limit of its address the 429 (SPEC §7).
            do {
                _ = try await authenticator.authenticate(request.headers)
            } catch let failure as GatewayError where failure.status == .unauthorized {
                throw authFailures.answer(error, .metrics, request: request, context: context)
            }
            throw GatewayError.permission("/metrics is the operator's: read it with the operator token or metrics.token.")
        }
        var headers = HTTPFields()
        headers[.contentType] = "text/plain; version=0.0.4; charset=utf-8"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: GatewayMetrics.exposition())))
    }
    router.get("/openapi.yaml") { _, _ in
        guard let text = OpenAPIDocument.text() else { throw GatewayError.notFound("openapi.yaml is not available in this build.") }
        var headers = HTTPFields()
        headers[.contentType] = "application/yaml"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}

/// A service that waits for shutdown, then runs `close` (so a client outlives the server).
package struct ClosingService: Service {
    let name: String
    let close: @Sendable () async throws -> Void

    package init(name: String, close: @escaping @Sendable () async throws -> Void) {
        self.name = name
        self.close = close
    }

    package func run() async throws {
        try? await gracefulShutdown()
        try await close()
    }
}

/// A 503 from `/readyz`: the SPEC's error envelope (`overloaded_error`) with the probe's `status`.
func notReady(_ status: String, _ message: String, extra: [JSON.Field] = []) -> Response {
    let envelope = GatewayError(.serviceUnavailable, "overloaded_error", message).body
    guard case .object(let fields) = envelope else { return jsonResponse(envelope, status: .serviceUnavailable) }
    return jsonResponse(.object(fields + [.init("status", .string(status))] + extra), status: .serviceUnavailable)
}
