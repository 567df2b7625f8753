import CapGate
import Foundation

/// The audit log (SPEC §13) as a list of rows, read newest first a page at a time by the id
/// cursor, one company's or all, filtered by action, as ``AuditReading`` asks.
///
/// Not modelled: the rows are written here by the test, not by the change they record (in
/// PostgreSQL each is written in the same transaction as its change, which only the integration
/// layer proves).
package struct InMemoryAudit: AuditReading {
    package struct Row: Sendable {
        package var id: Int64
        package var at: Date
        package var actor: String
        package var company: UUID?
        package var action: String
        package var target: String?
        package var before: JSON
        package var after: JSON
        package var requestID: String?
    }

    package private(set) var rows: [Row] = []

    package init() {}

    /// A row with the next id of the sequence; returns it.
    @discardableResult
    package mutating func add(
        action: String, company: UUID?, actor: String = "operator", at: Date, target: String? = nil, before: JSON = .null,
        after: JSON = .null
    ) -> Int64 {
        let id = Int64(rows.count + 1)
        rows.append(
            Row(
                id: id, at: at, actor: actor, company: company, action: action, target: target, before: before, after: after,
                requestID: "req_audit_\(id)"))
        return id
    }

    package func page(company: UUID?, action: String?, before: Int64?, limit: Int) async throws -> AuditPage {
        let matching = rows.filter {
            (company == nil || $0.company == company) && (action == nil || $0.action == action) && $0.id < before ?? Int64.max
        }
        .sorted { $0.id > $1.id }
        let page = matching.prefix(limit)
        let items = page.map {
            AuditPage.row(
                id: $0.id, at: $0.at, actor: $0.actor, company: $0.company, action: $0.action, target: $0.target, before: $0.before,
                after: $0.after, requestID: $0.requestID)
        }
        return AuditPage(items: items, next: matching.count > limit ? page.last?.id : nil)
    }
}
