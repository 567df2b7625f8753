import Foundation
import Hummingbird

/// SPEC §13: the audit log, newest first, paged by `cursor` (a previous page's `next_cursor`)
/// and `limit`, filtered by `action=`: a company's for its admins and the operator, the whole
/// gateway's for the operator.
struct AuditRoutes {
    let audit: any AuditReading
    let companies: any CompanyDirectory

    func register(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies/{id}/audit") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let (action, cursor, limit) = try Self.query(request)
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            let page = try await audit.page(company: id, action: action, before: cursor, limit: limit)
            return jsonResponse(listJSON(page.items, hasMore: page.next != nil, nextCursor: page.next.map { String($0) }))
        }
        group.get("audit") { request, context in
            try context.requireOperator()
            let (action, cursor, limit) = try Self.query(request)
            let page = try await audit.page(company: nil, action: action, before: cursor, limit: limit)
            return jsonResponse(listJSON(page.items, hasMore: page.next != nil, nextCursor: page.next.map { String($0) }))
        }
    }

    /// `action` (such as `api_key.revoke`), `cursor` and `limit` (1-500, default 50).
    static func query(_ request: Request) throws -> (action: String?, cursor: Int64?, limit: Int) {
        let query = request.uri.queryParameters
        let limit = try UsageRoutes.boundedInt(query.get("limit"), name: "limit", default: 50, range: 1...500)
        let action = query.get("action")
        if let action, !isAction(action) {
            throw GatewayError.invalidRequest("'action' must be an action name such as user.create or api_key.revoke.")
        }
        var cursor: Int64?
        if let text = query.get("cursor") {
            guard (1...18).contains(text.count), text.first != "0", text.allSatisfy({ $0.isASCII && $0.isNumber }),
                let value = Int64(text)
            else {
                throw GatewayError.invalidRequest("'cursor' must be a cursor from a previous page.")
            }
            cursor = value
        }
        return (action, cursor, limit)
    }

    /// `^[a-z_]+\.[a-z_]+$`, at most 64 characters, as the table's check says.
    static func isAction(_ s: String) -> Bool {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        return s.count <= 64 && parts.count == 2
            && parts.allSatisfy { !$0.isEmpty && $0.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || $0 == "_" } }
    }
}
