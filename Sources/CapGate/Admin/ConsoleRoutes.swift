import Foundation
import Hummingbird
import PostgresNIO

/// SPEC §10: the usage console. The page is plain files under `console/` in the repository
/// (HTML, CSS, JavaScript, no build step; embedded into the binary when it is built), served
/// with their content types, a strict Content-Security-Policy and no caching of stale code; its
/// data comes from the JSON API, plus the daily read here and `GET /admin/v1/me` (who the
/// pasted credential is).
struct ConsoleRoutes {
    let database: Database
    let tenants: TenantStore

    /// The files the page is made of, by the name they are served under.
    static let files: [String: String] = [
        "index.html": "text/html; charset=utf-8", "console.css": "text/css; charset=utf-8",
        "console.js": "text/javascript; charset=utf-8",
    ]

    /// Only this origin, nothing inline, no frames, no forms posting elsewhere.
    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    /// A file of the page, from `console/` as this binary was built with it (the same from any
    /// working directory).
    static func file(_ name: String) throws -> Response {
        guard let type = files[name], let text = EmbeddedFiles.text("console/" + name) else {
            throw GatewayError.notFound("The console is not available in this build.")
        }
        var headers = HTTPFields()
        headers[.contentType] = type
        headers[.cacheControl] = "no-cache"
        headers[.contentSecurityPolicy] = contentSecurityPolicy
        headers[.init("x-content-type-options")!] = "nosniff"
        headers[.init("referrer-policy")!] = "no-referrer"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    func registerPage(on router: Router<GatewayContext>) {
        router.get("/console") { _, _ in try Self.file("index.html") }
        router.get("/console/{file}") { _, context in try Self.file(context.parameters.get("file") ?? "") }
    }

    func register(on group: RouterGroup<AuthenticatedContext>) {
        group.get("me") { _, context in
            switch context.identity {
            case .operator:
                return jsonResponse(.obj(["role": "operator", "company_id": .null, "user_id": .null]))
            case .user(let user):
                return jsonResponse(
                    .obj(["role": .string(user.role.rawValue), "company_id": JSON(user.companyID), "user_id": JSON(user.userID)]))
            }
        }
        group.get("companies/{id}/usage/daily") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let query = request.uri.queryParameters
            let from = try Self.day(query.get("from"), name: "from")
            let to = try Self.day(query.get("to"), name: "to")
            guard try await tenants.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            return jsonResponse(.array(try await daily(company: id, from: from, to: to)))
        }
    }

    /// A `from`/`to` value: a day `YYYY-MM-DD` (in the company's zone) or an ISO-8601 time (its
    /// day in the company's zone).
    enum Day: Sendable {
        case date(String)
        case time(Date)
    }

    static func day(_ text: String?, name: String) throws -> Day? {
        guard let text, !text.isEmpty else { return nil }
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        if text.count == 10, parts.count == 3 {
            // A day: it must exist (no 30 February rolled into March).
            if let y = Int(parts[0]), let m = Int(parts[1]), let d = Int(parts[2]), parts[0].count == 4, parts[1].count == 2,
                parts[2].count == 2, (1...9999).contains(y),
                DateComponents(calendar: Calendar(identifier: .gregorian), year: y, month: m, day: d).isValidDate
            {
                return .date(text)
            }
        } else if let time = Timestamp.parse(text) {
            return .time(time)
        }
        throw GatewayError.invalidRequest("'\(name)' must be a day such as 2026-11-01 or an ISO-8601 time such as 2026-11-01T00:00:00Z.")
    }

    /// Units per day in the company's zone, every day of the range (0 where nothing was
    /// charged), split by feature. Default range: the current period's first day (or, with no
    /// period or a `to` before it, the 30 days ending at `to`) to today. Read from the ledger through its (company, time) index over the range only.
    func daily(company: UUID, from: Day?, to: Day?) async throws -> [JSON] {
        func date(_ day: Day?) -> String? { if case .date(let d) = day { d } else { nil } }
        func time(_ day: Day?) -> Date? { if case .time(let t) = day { t } else { nil } }
        let (fromDate, fromTime, toDate, toTime) = (date(from), time(from), date(to), time(to))
        return try await database.run { client in
            let bounds = try await client.query(
                """
                WITH z AS (SELECT time_zone AS tz, (now() AT TIME ZONE time_zone)::date AS today FROM companies WHERE id = \(company)),
                     e AS (
                        SELECT z.tz, coalesce(\(toDate)::date, (\(toTime)::timestamptz AT TIME ZONE z.tz)::date, z.today) AS d1,
                               (SELECT (p.started_at AT TIME ZONE z.tz)::date FROM plan_periods p
                                 WHERE p.company_id = \(company) AND p.started_at <= now() AND p.ends_at > now()
                                 ORDER BY p.started_at DESC LIMIT 1) AS period_day
                          FROM z),
                     b AS (
                        SELECT e.tz, e.d1,
                               coalesce(\(fromDate)::date, (\(fromTime)::timestamptz AT TIME ZONE e.tz)::date,
                                        CASE WHEN e.period_day <= e.d1 THEN e.period_day ELSE e.d1 - 29 END) AS d0
                          FROM e)
                SELECT tz, to_char(d0, 'YYYY-MM-DD'), to_char(d1, 'YYYY-MM-DD'), (d1 - d0)::bigint FROM b
                """, logger: database.logger)
            guard let (tz, d0, d1, span) = try await bounds.decode((String, String, String, Int64).self).collect().first else {
                return []
            }
            guard span >= 0 else { throw GatewayError.invalidRequest("'from' must not be after 'to'.") }
            guard span < 400 else { throw GatewayError.invalidRequest("A daily read spans at most 400 days; narrow 'from' and 'to'.") }
            let rows = try await client.query(
                """
                SELECT to_char(d.day, 'YYYY-MM-DD'), s.feature, coalesce(s.units, 0)::bigint
                  FROM generate_series(\(d0)::date, \(d1)::date, interval '1 day') AS d(day)
                  LEFT JOIN (
                        SELECT (l.created_at AT TIME ZONE \(tz))::date AS day, l.feature, sum(l.units) AS units
                          FROM usage_ledger l
                         WHERE l.company_id = \(company) AND l.outcome = 'charged'
                           AND l.created_at >= (\(d0)::date::timestamp AT TIME ZONE \(tz))
                           AND l.created_at < ((\(d1)::date + 1)::timestamp AT TIME ZONE \(tz))
                         GROUP BY 1, 2) s ON s.day = d.day::date
                 ORDER BY d.day, s.feature NULLS FIRST
                """, logger: database.logger)
            var days: [(date: String, units: Int64, features: [JSON.Field])] = []
            for try await (date, feature, units) in rows.decode((String, String?, Int64).self) {
                if days.last?.date != date { days.append((date, 0, [])) }
                days[days.count - 1].units += units
                if let feature { days[days.count - 1].features.append(.init(feature, .int(units))) }
            }
            return days.map { .obj(["date": .string($0.date), "units": .int($0.units), "features": .object($0.features)]) }
        }
    }
}
