import Foundation
import Hummingbird
import NIOCore

/// SPEC §4: usage for the calling user, for company admins, and the operator's overview.
struct UsageRoutes {
    let metering: MeteringStore
    /// The reads of `GET /v1/usage` and the admin routes.
    let usage: any UsageReading
    /// `/v1/usage/check`'s reads: the admission's own state and windows, in PostgreSQL only.
    let checks: UsageStore
    let companies: any CompanyDirectory

    /// `GET /v1/usage` and `GET /v1/usage/check` (paths relative to the group).
    func registerClient(on group: RouterGroup<AuthenticatedContext>) {
        group.get("usage") { _, context in
            let user = try context.requireUser()
            await metering.slotEndsWritten()
            let now = Date()
            let read = try await usage.callerUsage(company: user.companyID, user: user.userID, at: now)
            return try jsonResponse(encoding: read, headers: read.state.rateLimitHeaders(now: now))
        }
        group.get("usage/check") { request, context in
            try await check(request, user: try context.requireUser())
        }
    }

    /// `GET /v1/usage/check`: what the caller's next call would get (SPEC §4), changing nothing.
    func check(_ request: Request, user: UserIdentity) async throws -> Response {
        let query = request.uri.queryParameters
        var units: Int64 = 1
        if let text = query.get("units") {
            guard let n = Int64(text), n >= 1, n <= 1_000_000 else {
                throw GatewayError.invalidRequest("'units' must be a whole number from 1 to 1000000.")
            }
            units = n
        }
        let featureID = try Self.feature(query.get("feature"))
        await metering.slotEndsWritten()
        let now = Date()
        // The feature is looked up before anything else is read, so a 400 changes nothing
        // (the state read below may move an ended period forward, as the next call would).
        var lookup: (lookup: UsageStore.FeatureLookup, periodStart: Date?)? = nil
        if let featureID {
            lookup = try await checks.feature(featureID, company: user.companyID, user: user.userID, at: now)
            if case .unknown = lookup?.lookup {
                throw GatewayError.invalidRequest(
                    "'feature' names \"\(featureID)\", which is not a feature of this gateway or is not active.")
            }
        }
        let state = try await metering.state(companyID: user.companyID, userID: user.userID, at: now)
        if let featureID, let read = lookup, read.periodStart != state.periodStart {
            // The company was just moved into a new period: read its windows there.
            lookup = try await checks.feature(featureID, company: user.companyID, user: user.userID, at: now)
        }
        let grants = try await checks.grants(company: user.companyID)
        var rate = try await checks.rateWindows(company: user.companyID, user: user.userID, at: now)
        if let featureID, case .entitled = lookup?.lookup,
            let entitled = try await checks.featureRateWindows(
                company: user.companyID, user: user.userID, feature: featureID, at: now)
        {
            // The entitlement's windows, counted after the plan's as the admission counts them.
            if rate == nil { rate = RateState(limits: .init(), minute: entitled.minute, counts: .init()) }
            rate?.feature = entitled.windows
        }
        let check = UsageCheck(
            units: units, user: user.userID, state: state, feature: lookup?.lookup,
            grantUnits: grants.compactMap { $0.remainingUnits(at: now) }.max() ?? 0, rate: rate)
        var outcome = try await check.decide(metering: metering)
        // A bound credential (SPEC §8) would be refused 403 for another feature, before its limits.
        if let featureID, let bound = user.features, !bound.contains(featureID) {
            outcome = UsageCheck.Outcome(
                refusal: .notBound(feature: featureID, bound: bound, credential: user.credential), state: state)
        }
        return jsonResponse(
            .obj([
                "allowed": .bool(outcome.refusal == nil), "reason": JSON(outcome.refusal?.errorType),
                "usage": Responder.usage(for: outcome.refusal, state: outcome.state),
            ]),
            headers: outcome.state.rateLimitHeaders(now: now)
        )
    }

    /// The admin routes under `/admin/v1`.
    func registerAdmin(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies") { request, context in
            try context.requireOperator()
            let query = request.uri.queryParameters
            // Every company unless a page size is asked for (SPEC: "every company").
            let limit = try query.get("limit").map { try Self.boundedInt($0, name: "limit", default: 100, range: 1...1000) }
            let cursor = try Self.boundedInt(query.get("cursor"), name: "cursor", default: 0, range: 0...(1 << 40))
            let sort = query.get("sort") ?? "created"
            guard ["usage", "created"].contains(sort) else {
                throw GatewayError.invalidRequest("'sort' must be 'usage' or 'created'.")
            }
            let rows = try await usage.companies(sortByUsage: sort == "usage", after: cursor, limit: limit.map { $0 + 1 }, at: Date())
            guard let limit else { return try jsonResponse(encoding: ListPage(rows)) }
            let hasMore = rows.count > limit
            return try jsonResponse(
                encoding: ListPage(Array(rows.prefix(limit)), hasMore: hasMore, nextCursor: hasMore ? String(cursor + limit) : nil))
        }
        group.get("companies/{id}/usage") { _, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            // The company's windows of each feature, at the top and (as in /v1/usage) in `usage`;
            // each user's own windows in its entry of `users`; all from one snapshot.
            guard let read = try await usage.companyUsage(id, at: Date()) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(encoding: read)
        }
        group.get("companies/{id}/usage/history") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let periods = try Self.boundedInt(request.uri.queryParameters.get("periods"), name: "periods", default: 12, range: 1...120)
            let feature = try Self.feature(request.uri.queryParameters.get("feature"))
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(
                encoding: ListPage(try await usage.history(company: id, periods: periods, feature: feature, at: Date())))
        }
        group.get("companies/{id}/usage/models") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let period = try Self.period(request.uri.queryParameters.get("period"))
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            // Token counts and costs are written in batches after each answer (as for the events).
            await metering.settledSoFar()
            guard let read = try await usage.models(company: id, period: period, at: Date()) else {
                if case .startingOn(let day) = period {
                    throw GatewayError.notFound("No period of this company starts on \(day) (see its usage history).")
                }
                throw GatewayError.notFound("The company has no current period (no plan).")
            }
            return try jsonResponse(encoding: read)
        }
        registerEvents(on: group)
    }

    /// `GET /admin/v1/companies/{id}/events`: the ledger, a page at a time, or the whole range as CSV.
    func registerEvents(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies/{id}/events") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let query = request.uri.queryParameters
            let from = try Self.time(query.get("from"), name: "from") ?? Date(timeIntervalSince1970: 0)
            let to = try Self.time(query.get("to"), name: "to") ?? Date(timeIntervalSince1970: 253_402_300_799)
            guard from <= to else { throw GatewayError.invalidRequest("'from' must not be after 'to'.") }
            let limit = try Self.boundedInt(query.get("limit"), name: "limit", default: 100, range: 1...1000)
            let order = query.get("order") ?? "asc"
            guard order == "asc" || order == "desc" else {
                throw GatewayError.invalidRequest("'order' must be 'asc' (oldest first, the default) or 'desc' (newest first).")
            }
            var cursor: Int64 = order == "desc" ? Int64.max : 0
            if let text = query.get("cursor") {
                guard let c = Int64(text), c >= 0 else {
                    throw GatewayError.invalidRequest("'cursor' must be a cursor from a previous page.")
                }
                cursor = c
            }
            let feature = try Self.feature(query.get("feature"))
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            // Token counts are written in batches after each answer: wait for those queued so far,
            // so a read right after a call sees its tokens (within this gateway).
            await metering.settledSoFar()
            let accept = request.headers[.accept]?.lowercased() ?? ""
            if accept.contains("text/csv") {
                // The CSV is the whole range, oldest first, whatever `order` says.
                return csvResponse(company: id, from: from, to: to, after: order == "desc" ? 0 : cursor, feature: feature)
            }
            let rows = try await usage.events(
                company: id, from: from, to: to, after: cursor, limit: limit + 1, feature: feature, newestFirst: order == "desc")
            let page = Array(rows.prefix(limit))
            let hasMore = rows.count > limit
            return try jsonResponse(encoding: ListPage(page, hasMore: hasMore, nextCursor: hasMore ? page.last.map { String($0.id) } : nil))
        }
    }

    /// Streams every row of the range (of `feature` when given) as CSV, a page at a time, never holding it all.
    func csvResponse(company: UUID, from: Date, to: Date, after cursor: Int64, feature: String?) -> Response {
        let usage = self.usage
        var headers = HTTPFields()
        headers[.contentType] = "text/csv; charset=utf-8"
        headers[.contentDisposition] = "attachment; filename=\"events.csv\""
        return Response(
            status: .ok,
            headers: headers,
            body: ResponseBody { writer in
                try await writer.write(ByteBuffer(string: UsageStore.Event.csvHeader))
                var after = cursor
                while true {
                    let page = try await usage.events(company: company, from: from, to: to, after: after, limit: 1000, feature: feature)
                    if page.isEmpty { break }
                    var text = ""
                    for event in page { text += event.csvLine }
                    try await writer.write(ByteBuffer(string: text))
                    after = page.last!.id
                    if page.count < 1000 { break }
                }
                try await writer.finish(nil)
            }
        )
    }

    static func boundedInt(_ text: String?, name: String, default value: Int, range: ClosedRange<Int>) throws -> Int {
        guard let text else { return value }
        guard let n = Int(text), range.contains(n) else {
            throw GatewayError.invalidRequest("'\(name)' must be a whole number from \(range.lowerBound) to \(range.upperBound).")
        }
        return n
    }

    /// The `feature` query parameter: absent is nil; anything but a feature id (a slug of at most
    /// 64 characters, as `features.id`) is 400. A well-formed id of no feature is the caller's to
    /// interpret (the reads then find nothing).
    static func feature(_ text: String?) throws -> String? {
        guard let text else { return nil }
        guard OperatorRoutes.isSlug(text) else {
            throw GatewayError.invalidRequest("'feature' must be a feature id: 1 to 64 lowercase letters, digits, '-', '_' or '.'.")
        }
        return text
    }

    /// The `period` query parameter of the models read: absent is the current period; else the
    /// start date of a period as the history writes it (`YYYY-MM-DD`, UTC), anything else 400.
    static func period(_ text: String?) throws -> UsageStore.PeriodChoice {
        guard let text else { return .current }
        guard let choice = UsageStore.PeriodChoice(day: text) else {
            throw GatewayError.invalidRequest("'period' must be the start date of a period, YYYY-MM-DD, such as 2026-11-01.")
        }
        return choice
    }

    static func time(_ text: String?, name: String) throws -> Date? {
        guard let text, !text.isEmpty else { return nil }
        guard let date = Timestamp.parse(text) else {
            throw GatewayError.invalidRequest("'\(name)' must be an ISO-8601 time such as 2026-11-01T00:00:00Z.")
        }
        return date
    }
}
