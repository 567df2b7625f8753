import Foundation
import Logging
import PostgresNIO

/// What the audit routes (SPEC §13) ask of their store: ``AuditStore`` reads PostgreSQL,
/// `CapGateDev`'s in-memory store a list of rows.
package protocol AuditReading: Sendable {
    /// Rows with `id < before` (all when nil), of `company` (all when nil) and `action` (all when
    /// nil), newest first, at most `limit`.
    func page(company: UUID?, action: String?, before: Int64?, limit: Int) async throws -> AuditPage
}

/// One page of the audit log: the rows and, when there are more, the cursor of the next page
/// (the last row's id).
package struct AuditPage: Sendable {
    package var items: [JSON]
    package var next: Int64?

    package init(items: [JSON], next: Int64?) {
        self.items = items
        self.next = next
    }
}

/// Reads of the audit log (SPEC §13): newest first, a page at a time, one company's or all.
struct AuditStore: AuditReading {
    let database: Database

    typealias Page = AuditPage

    /// Rows with `id < before` (all when nil), of `company` (all when nil) and `action` (all when
    /// nil), newest first, at most `limit`.
    func page(company: UUID?, action: String?, before: Int64?, limit: Int) async throws -> Page {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT id, at, actor, company_id, action, target_id, before::text, after::text, request_id
                  FROM audit_log
                 WHERE (\(company)::uuid IS NULL OR company_id = \(company))
                   AND (\(action)::text IS NULL OR action = \(action))
                   AND id < \(before ?? Int64.max)
                 ORDER BY id DESC LIMIT \(Int64(limit + 1))
                """, logger: database.logger)
            var items: [JSON] = []
            var last: Int64?
            for try await r in rows.decode((Int64, Date, String, UUID?, String, String?, String?, String?, String?).self) {
                guard items.count < limit else { return Page(items: items, next: last) }
                items.append(Self.json(r))
                last = r.0
            }
            return Page(items: items, next: nil)
        }
    }

    /// A row as the API writes it; `before`/`after` are the stored JSON objects.
    static func json(_ r: (Int64, Date, String, UUID?, String, String?, String?, String?, String?)) -> JSON {
        func parsed(_ text: String?) -> JSON { text.flatMap { try? JSON.parse(Array($0.utf8)) } ?? .null }
        return AuditPage.row(
            id: r.0, at: r.1, actor: r.2, company: r.3, action: r.4, target: r.5, before: parsed(r.6), after: parsed(r.7), requestID: r.8)
    }
}

extension AuditPage {
    /// An audit row as the API writes it (both stores build it here).
    package static func row(
        id: Int64, at: Date, actor: String, company: UUID?, action: String, target: String?, before: JSON, after: JSON,
        requestID: String?
    ) -> JSON {
        .obj([
            "id": .int(id), "time": JSON(at), "actor": .string(actor), "company_id": JSON(company), "action": .string(action),
            "target_id": JSON(target), "before": before, "after": after, "request_id": JSON(requestID),
        ])
    }
}
