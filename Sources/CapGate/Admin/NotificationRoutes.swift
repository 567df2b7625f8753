import Foundation
import Hummingbird

/// SPEC §9: a company's threshold notifications, newest first, for its admins and the operator.
struct NotificationRoutes {
    let notifications: any NotificationReading
    let companies: any CompanyDirectory

    static let statuses: Set<String> = ["pending", "delivered", "failed"]

    func register(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies/{id}/notifications") { request, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            let query = request.uri.queryParameters
            let limit = try UsageRoutes.boundedInt(query.get("limit"), name: "limit", default: 50, range: 1...500)
            let status = query.get("status")
            if let status, !Self.statuses.contains(status) {
                throw GatewayError.invalidRequest("'status' must be pending, delivered or failed.")
            }
            var cursor: NotificationCursor?
            if let text = query.get("cursor") {
                guard let parsed = NotificationCursor(text) else {
                    throw GatewayError.invalidRequest("'cursor' must be a cursor from a previous page.")
                }
                cursor = parsed
            }
            guard try await companies.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            let page = try await notifications.list(
                company: id, status: status, after: cursor, limit: limit, detailed: context.identity.isOperator)
            return jsonResponse(listJSON(page.items, hasMore: page.next != nil, nextCursor: page.next?.text))
        }
    }
}
