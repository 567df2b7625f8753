import Foundation
import Hummingbird

/// SPEC §10: the usage console. The page is plain files under `console/` in the repository
/// (HTML, CSS, JavaScript, no build step; embedded into the binary when it is built), served
/// with their content types, a strict Content-Security-Policy and no caching of stale code; its
/// data comes from the JSON API, plus the daily read here and `GET /admin/v1/me` (who the
/// pasted credential is).
struct ConsoleRoutes {
    /// The daily read's store.
    let daily: any DailyUsageReading
    let companies: any CompanyDirectory

    /// The files the page is made of, by the name they are served under.
    static let files: [String: String] = {
        var files = ["index.html": "text/html; charset=utf-8", "console.css": "text/css; charset=utf-8"]
        for script in scripts { files[script] = "text/javascript; charset=utf-8" }
        return files
    }()

    /// The page's scripts, one per view or concern (`index.html` loads them in this order).
    static let scripts = [
        "console.js", "forms.js", "usage.js", "charts.js", "people.js", "plan.js", "audit.js", "operator.js", "catalog.js",
        "prices.js", "boot.js",
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
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(encoding: try await daily.daily(company: id, from: from, to: to))
        }
    }

    /// A `from`/`to` value (``UsageStore/DayBound``).
    typealias Day = UsageStore.DayBound

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
}
