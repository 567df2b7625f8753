import Foundation
import Hummingbird
import NIOCore

/// SPEC §4: usage for the calling user, for company admins, and the operator's overview.
struct UsageRoutes {
    let metering: MeteringStore
    let usage: UsageStore
    let tenants: TenantStore

    /// `GET /v1/usage` and `GET /v1/usage/check` (paths relative to the group).
    func registerClient(on group: RouterGroup<AuthenticatedContext>) {
        group.get("usage") { _, context in
            let user = try context.requireUser()
            let state = try await metering.state(companyID: user.companyID, userID: user.userID)
            return jsonResponse(state.json(scope: "user"), headers: state.rateLimitHeaders())
        }
        group.get("usage/check") { request, context in
            let user = try context.requireUser()
            var units: Int64 = 1
            if let text = request.uri.queryParameters.get("units") {
                guard let n = Int64(text), n >= 1, n <= 1_000_000 else {
                    throw GatewayError.invalidRequest("'units' must be a whole number from 1 to 1000000.")
                }
                units = n
            }
            let state = try await metering.state(companyID: user.companyID, userID: user.userID)
            var reason: String? = nil
            var scope = "user"
            if state.plan == nil {
                reason = "no_active_plan"
                scope = "company"
            } else if let cap = state.companyLimit, state.companyUsed + units > cap {
                reason = "usage_cap_exceeded"
                scope = "company"
            } else if let cap = state.userLimit, (state.userUsed ?? 0) + units > cap {
                reason = "usage_cap_exceeded"
            }
            return jsonResponse(
                .obj(["allowed": .bool(reason == nil), "reason": JSON(reason), "usage": state.json(scope: scope)]),
                headers: state.rateLimitHeaders()
            )
        }
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
            let rows = try await usage.companies(sortByUsage: sort == "usage", after: cursor, limit: limit.map { $0 + 1 })
            guard let limit else { return jsonResponse(listJSON(rows)) }
            let hasMore = rows.count > limit
            return jsonResponse(listJSON(Array(rows.prefix(limit)), hasMore: hasMore, nextCursor: hasMore ? String(cursor + limit) : nil))
        }
        group.get("companies/{id}/usage") { _, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            guard let company = try await tenants.company(id) else { throw GatewayError.notFound("No company with that id.") }
            let state = try await metering.state(companyID: id, userID: nil)
            let period = try await usage.currentPeriod(company: id)
            let users = try await usage.users(company: id, periodID: period?.id, planUserCap: period?.userCap)
            return jsonResponse(
                .obj(["company": company, "usage": state.json(scope: "company", includeUser: false), "users": .array(users)]))
        }
        group.get("companies/{id}/usage/history") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let periods = try Self.boundedInt(request.uri.queryParameters.get("periods"), name: "periods", default: 12, range: 1...120)
            guard try await tenants.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            return jsonResponse(listJSON(try await usage.history(company: id, periods: periods)))
        }
        group.get("companies/{id}/events") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let query = request.uri.queryParameters
            let from = try Self.time(query.get("from"), name: "from") ?? Date(timeIntervalSince1970: 0)
            let to = try Self.time(query.get("to"), name: "to") ?? Date(timeIntervalSince1970: 253_402_300_799)
            guard from <= to else { throw GatewayError.invalidRequest("'from' must not be after 'to'.") }
            let limit = try Self.boundedInt(query.get("limit"), name: "limit", default: 100, range: 1...1000)
            var cursor: Int64 = 0
            if let text = query.get("cursor") {
                guard let c = Int64(text), c >= 0 else {
                    throw GatewayError.invalidRequest("'cursor' must be a cursor from a previous page.")
                }
                cursor = c
            }
            guard try await tenants.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            // Token counts are written in batches after each answer: wait for those queued so far,
            // so a read right after a call sees its tokens (within this gateway).
            await metering.settledSoFar()
            let accept = request.headers[.accept]?.lowercased() ?? ""
            if accept.contains("text/csv") {
                return csvResponse(company: id, from: from, to: to, after: cursor)
            }
            let rows = try await usage.events(company: id, from: from, to: to, after: cursor, limit: limit + 1)
            let page = Array(rows.prefix(limit))
            let hasMore = rows.count > limit
            return jsonResponse(listJSON(page.map(\.json), hasMore: hasMore, nextCursor: hasMore ? page.last.map { String($0.id) } : nil))
        }
    }

    /// Streams every row of the range as CSV, a page at a time, never holding it all.
    func csvResponse(company: UUID, from: Date, to: Date, after cursor: Int64) -> Response {
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
                    let page = try await usage.events(company: company, from: from, to: to, after: after, limit: 1000)
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

    static func time(_ text: String?, name: String) throws -> Date? {
        guard let text, !text.isEmpty else { return nil }
        guard let date = Timestamp.parse(text) else {
            throw GatewayError.invalidRequest("'\(name)' must be an ISO-8601 time such as 2026-11-01T00:00:00Z.")
        }
        return date
    }
}
