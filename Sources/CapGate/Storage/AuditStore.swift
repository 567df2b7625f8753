import Foundation
import Logging
import PostgresNIO

/// Reads of the audit log (SPEC §13): newest first, a page at a time, one company's or all.
struct AuditStore: Sendable {
    let database: Database

    /// One page: the rows and, when there are more, the cursor of the next page (the last row's id).
    struct Page: Sendable {
        var items: [JSON]
        var next: Int64?
    }

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
        return .obj([
            "id": .int(r.0), "time": JSON(r.1), "actor": .string(r.2), "company_id": JSON(r.3), "action": .string(r.4),
            "target_id": JSON(r.5), "before": parsed(r.6), "after": parsed(r.7), "request_id": JSON(r.8),
        ])
    }
}
