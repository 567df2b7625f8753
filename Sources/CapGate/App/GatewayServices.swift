/// What the router's routes are served by: the proxy, the authenticator and the stores, made
/// once by ``GatewayParts`` (as the Hummingbird template's `buildRouter` takes one repository).
struct GatewayServices {
    /// Where provider calls are routed (`proxy.prefix`); ``GatewayMiddleware`` hands them to `proxy`.
    var proxyPrefix: String
    var proxy: ProxyHandler
    var authenticator: Authenticator
    var database: Database
    /// The build's migrations, which `/readyz` compares with the database's.
    var migrator: Migrator
    var metering: MeteringStore
    var tenants: TenantStore
    var periods: PeriodStore
    /// The usage reads that run the admission's SQL (`/v1/usage/check`); the others are in ``stores``.
    var usage: UsageStore
    /// The stores the read routes and authentication ask of, behind their protocols.
    var stores: GatewayStores
    var billing: BillingStore
    /// The price book (SPEC §11).
    var prices: PriceStore
    /// The App Store's signed-data verifier (SPEC §12).
    var apple: AppleSignedData
    var metricsAccess: MetricsAccess
    /// Failed operator and metrics authentications per client address (SPEC §7).
    var authFailures: FailedAuthThrottle
}

/// The stores the read routes and authentication ask of, each behind a small protocol:
/// PostgreSQL's in the gateway, `CapGateDev`'s in-memory ones in the router tests (which pass
/// them to ``GatewayParts/init(configuration:logger:stores:)``).
struct GatewayStores: Sendable {
    /// `GET /v1/usage` and the admin usage reads (SPEC §4).
    var usage: any UsageReading
    /// The console's daily read (SPEC §10).
    var daily: any DailyUsageReading
    /// Whether a company exists (the 404 of the company-scoped reads).
    var companies: any CompanyDirectory
    /// API keys and a token's user (SPEC §2).
    var credentials: any CredentialStore
    /// The audit log's reads (SPEC §13).
    var audit: any AuditReading
    /// A company's threshold notifications (SPEC §9).
    var notifications: any NotificationReading

    /// Every store on `database`.
    static func postgres(_ database: Database) -> GatewayStores {
        GatewayStores(
            usage: UsageStore(database: database), daily: UsageStore(database: database), companies: TenantStore(database: database),
            credentials: PostgresCredentials(database: database), audit: AuditStore(database: database),
            notifications: NotificationStore(database: database))
    }
}
