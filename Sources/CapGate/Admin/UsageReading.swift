import Foundation

/// What the usage routes (SPEC §4: `GET /v1/usage`, the operator's overview and a company's
/// usage, history, models and events) ask of their store, and nothing more: ``UsageStore`` reads
/// PostgreSQL; `CapGateDev`'s in-memory store answers the same questions from plain values, so
/// the routes are tested through `app.test(.router)` without a database.
package protocol UsageReading: Sendable {
    /// What `user` of `company` sees in `GET /v1/usage`.
    func callerUsage(company: UUID, user: UUID, at: Date) async throws -> CallerUsage
    /// The admin usage read; nil when there is no such company.
    func companyUsage(_ company: UUID, at: Date) async throws -> CompanyUsage?
    /// The billing overview: every company after `cursor` (an offset), at most `limit` (nil: all).
    func companies(sortByUsage: Bool, after cursor: Int, limit: Int?, at: Date) async throws -> [CompanyOverview]
    /// Past periods (ended by `at`), newest first, at most `periods`; with `feature`, its units.
    func history(company: UUID, periods: Int, feature: String?, at: Date) async throws -> [PeriodUsage]
    /// The charged calls of one period grouped by model; nil when no period is that one.
    func models(company: UUID, period: UsageStore.PeriodChoice, at: Date) async throws -> PeriodModels?
    /// Ledger rows in `[from, to)` past the keyset cursor (row id), oldest first (or newest first),
    /// only `feature`'s when given; a charge with no settlement is `unsettled` once older than
    /// `grace` seconds at `now`.
    func events(
        company: UUID, from: Date, to: Date, after cursor: Int64, limit: Int, feature: String?, newestFirst: Bool, now: Date,
        grace: TimeInterval
    ) async throws -> [UsageStore.Event]
}

extension UsageReading {
    /// ``events(company:from:to:after:limit:feature:newestFirst:now:grace:)`` now, with the default grace.
    func events(
        company: UUID, from: Date, to: Date, after cursor: Int64, limit: Int, feature: String? = nil, newestFirst: Bool = false
    ) async throws -> [UsageStore.Event] {
        try await events(
            company: company, from: from, to: to, after: cursor, limit: limit, feature: feature, newestFirst: newestFirst, now: Date(),
            grace: UnsettledCharges.defaultGrace)
    }
}

/// The console's daily read (`GET /admin/v1/companies/{id}/usage/daily`).
package protocol DailyUsageReading: Sendable {
    /// A company's units per day of its time zone, oldest first, within the bounds given.
    func daily(company: UUID, from: UsageStore.DayBound?, to: UsageStore.DayBound?) async throws -> [DailyUsage]
}

/// Whether a company exists: the 404 every company-scoped read answers first.
package protocol CompanyDirectory: Sendable {
    func companyExists(_ id: UUID) async throws -> Bool
}

extension UsageStore: UsageReading, DailyUsageReading {}
extension TenantStore: CompanyDirectory {}
