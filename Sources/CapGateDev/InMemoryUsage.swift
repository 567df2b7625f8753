import CapGate
import Foundation

/// The usage reads (``UsageReading``), the daily read and the company lookup answered from an
/// ``InMemoryTenants``: the current period and the caps from the periods and plans, `used` summed
/// from the charged calls of the ledger, pages cut as PostgreSQL's queries cut them.
///
/// Not modelled (only PostgreSQL and the integration layer prove them): a read's snapshot under
/// concurrent admissions (here nothing changes while a read runs); moving a company whose period
/// ended into the next one (`capgate_roll_company`); features' windows, rate windows, cost
/// budgets and top-up grants (the reads show none: no features, unlimited budgets, no grants);
/// the upgrade offer; the rollups (the sums are taken from the ledger directly).
package struct InMemoryUsage: UsageReading, DailyUsageReading, CompanyDirectory {
    package var tenants: InMemoryTenants

    package init(_ tenants: InMemoryTenants) {
        self.tenants = tenants
    }

    package func companyExists(_ id: UUID) async throws -> Bool { tenants.company(id) != nil }

    /// The caps and counters of the period containing `at`; with `user`, its own.
    func state(company: UUID, user: UUID?, at: Date) -> UsageState {
        guard let period = tenants.period(of: company, at: at), let plan = tenants.plans[period.planID] else {
            return UsageState(
                plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: user.map { _ in 0 },
                userLimit: nil)
        }
        let own = tenants.users.first { $0.companyID == company && $0.id == user }?.cap
        return UsageState(
            plan: .init(id: plan.id, name: plan.name), periodStart: period.start, periodEnd: period.end,
            companyUsed: tenants.units(tenants.charged(company, in: period)), companyLimit: plan.companyCap,
            userUsed: user.map { tenants.units(tenants.charged(company, in: period, user: $0)) },
            userLimit: user == nil ? nil : own ?? plan.userCap)
    }

    package func callerUsage(company: UUID, user: UUID, at: Date) async throws -> CallerUsage {
        CallerUsage(
            company: company, user: user, appAccountToken: tenants.company(company)?.appAccountToken,
            state: state(company: company, user: user, at: at), features: [], cost: CostUsage(company: .unlimited, user: .unlimited),
            at: at)
    }

    package func companyUsage(_ company: UUID, at: Date) async throws -> CompanyUsage? {
        guard let row = tenants.company(company) else { return nil }
        let period = tenants.period(of: company, at: at)
        let plan = period.flatMap { tenants.plans[$0.planID] }
        let users = tenants.users(of: company).map { user in
            UserUsage(
                id: user.id, email: user.email, role: user.role.rawValue, disabled: user.disabled,
                used: period.map { tenants.units(tenants.charged(company, in: $0, user: user.id)) } ?? 0,
                limit: user.cap ?? plan?.userCap, features: [], cost: .unlimited)
        }
        let json = TenantStore.companyJSON(
            (row.id, row.name, row.createdAt, period?.planID, period?.start, period?.end, period?.autoRenew, row.timeZone, row.webhookURL))
        return CompanyUsage(
            company: json, state: state(company: company, user: nil, at: at), features: [], users: users, cost: .unlimited, grants: [],
            at: at)
    }

    package func companies(sortByUsage: Bool, after cursor: Int, limit: Int?, at: Date) async throws -> [CompanyOverview] {
        var rows = tenants.companies.map { company -> CompanyOverview in
            let state = state(company: company.id, user: nil, at: at)
            let percent = state.companyLimit.flatMap { cap in
                cap > 0 ? (Double(state.companyUsed) * 100 / Double(cap) * 10).rounded() / 10 : nil
            }
            return CompanyOverview(
                id: company.id, name: company.name, plan: state.plan?.id, periodEnd: state.periodEnd, used: state.companyUsed,
                cap: state.companyLimit, percentUsed: percent)
        }
        let created = Dictionary(uniqueKeysWithValues: tenants.companies.map { ($0.id, $0.createdAt) })
        // PostgreSQL's orders: `pct DESC NULLS LAST, used DESC, id`, or `created_at, id`.
        rows.sort { a, b in
            if sortByUsage {
                if a.percentUsed != b.percentUsed { return (a.percentUsed ?? -1) > (b.percentUsed ?? -1) }
                if a.used != b.used { return a.used > b.used }
            } else if created[a.id] != created[b.id] {
                return created[a.id]! < created[b.id]!
            }
            return a.id.uuidString.lowercased() < b.id.uuidString.lowercased()
        }
        let page = rows.dropFirst(cursor)
        return Array(limit.map { page.prefix($0) } ?? page)
    }

    package func history(company: UUID, periods count: Int, feature: String?, at: Date) async throws -> [PeriodUsage] {
        let ended = tenants.periods.filter { $0.companyID == company && $0.end <= at }.sorted { $0.start > $1.start }.prefix(count)
        return ended.compactMap { period in
            guard let plan = tenants.plans[period.planID] else { return nil }
            let calls = tenants.charged(company, in: period).filter { feature == nil || $0.feature == feature }
            // A feature's limit is the plan's entitlement as it is now: 0 when the plan has none.
            let limit = feature.map { plan.features[$0] ?? 0 } ?? plan.companyCap
            return PeriodUsage(
                start: period.start, end: period.end, planID: plan.id, planName: plan.name, used: tenants.units(calls), limit: limit,
                feature: feature, cost: .unlimited)
        }
    }

    package func models(company: UUID, period choice: UsageStore.PeriodChoice, at: Date) async throws -> PeriodModels? {
        let chosen: InMemoryTenants.Period?
        switch choice {
        case .current:
            chosen = tenants.period(of: company, at: at)
        case .startingOn(let day):
            chosen = tenants.periods.filter { $0.companyID == company && Self.utcDay($0.start) == day }.max { $0.start < $1.start }
        }
        guard let period = chosen else { return nil }
        let groups = Dictionary(grouping: tenants.charged(company, in: period)) { $0.model }
        let models = groups.map { model, calls in
            ModelUsage(
                model: model, calls: Int64(calls.count), inputTokens: calls.reduce(0) { $0 + ($1.inputTokens ?? 0) },
                outputTokens: calls.reduce(0) { $0 + ($1.outputTokens ?? 0) }, cacheWriteTokens: 0, cacheReadTokens: 0,
                cost: Micros(calls.reduce(0) { $0 + ($1.cost?.value ?? 0) }),
                held: Micros(calls.reduce(0) { $0 + ($1.cost == nil ? $1.hold?.value ?? 0 : 0) }))
        }
        // PostgreSQL's order: cost, highest first, then the model's name (no model last).
        let sorted = models.sorted { a, b in
            if a.cost != b.cost { return a.cost > b.cost }
            return (a.model ?? "\u{10FFFF}") < (b.model ?? "\u{10FFFF}")
        }
        return PeriodModels(start: period.start, end: period.end, models: sorted)
    }

    package func events(
        company: UUID, from: Date, to: Date, after cursor: Int64, limit: Int, feature: String?, newestFirst: Bool, now: Date,
        grace: TimeInterval
    ) async throws -> [UsageStore.Event] {
        let rows = tenants.calls.filter { call in
            call.companyID == company && call.at >= from && call.at < to && (newestFirst ? call.id < cursor : call.id > cursor)
                && (feature == nil || call.feature == feature)
        }
        return (newestFirst ? rows.reversed() : rows).prefix(limit).compactMap { call in
            guard let period = tenants.period(of: company, at: call.at) else { return nil }
            let outcome = call.refunded ? "refunded" : "charged"
            var event = UsageStore.Event(
                id: call.id, createdAt: call.at, companyID: company, userID: call.userID, period: (period.start, period.end),
                units: call.units, route: "/v1/messages", model: call.model, feature: call.feature, outcome: outcome,
                requestID: "req_\(call.id)",
                settlement: .of(
                    outcome: outcome, settledAt: call.cost == nil ? nil : call.at, upstreamStatus: call.cost == nil ? nil : 200,
                    createdAt: call.at, now: now, grace: grace))
            event.inputTokens = call.inputTokens
            event.outputTokens = call.outputTokens
            event.cost = call.cost
            event.hold = call.hold
            event.costSource = call.cost == nil ? nil : "usage"
            return event
        }
    }

    /// `YYYY-MM-DD` of `date` in UTC (as the history writes a period's start).
    static func utcDay(_ date: Date) -> String { day(date, in: TimeZone(identifier: "UTC")!) }

    static func day(_ date: Date, in zone: TimeZone) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        let c = calendar.dateComponents([.year, .month, .day], from: date)
        return String(format: "%04d-%02d-%02d", c.year!, c.month!, c.day!)
    }
}
