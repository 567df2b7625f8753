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
    var usage: UsageStore
    var billing: BillingStore
    /// The price book (SPEC §11).
    var prices: PriceStore
    /// The App Store's signed-data verifier (SPEC §12).
    var apple: AppleSignedData
    var metricsAccess: MetricsAccess
    /// Failed operator and metrics authentications per client address (SPEC §7).
    var authFailures: FailedAuthThrottle
}
