import Foundation
import Logging
import PostgresNIO

/// The notification rows of SPEC §9 as JSON: the webhook payload the deliverer signs and the
/// admin read (`GET /admin/v1/companies/{id}/notifications`) share one column list and one
/// builder, so what an admin reads is what the receiver got.
struct NotificationStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    /// The payload's columns, in the order `payload(_:from:)` reads them.
    static let payloadColumns = """
        n.company_id, n.id, n.created_at, c.name, n.user_id, u.email, n.scope, n.feature_id, n.span, n.window_start,
        n.window_end, n.threshold, n.used, n.limit_value
        """
    /// The rows with their company and (for a user's counter) user.
    static let payloadSource = """
        notifications n
        JOIN companies c ON c.id = n.company_id
        LEFT JOIN users u ON u.company_id = n.company_id AND u.id = n.user_id
        """
    static let payloadColumnCount = 14

    /// The SPEC §9 webhook body from the `payloadColumns` starting at column `first`.
    static func payload(_ row: PostgresRow, from first: Int = 0) throws -> JSON {
        let cells = row.makeRandomAccess()
        func cell<T: PostgresDecodable>(_ index: Int, _ type: T.Type) throws -> T { try cells[first + index].decode(T.self) }
        let company = try cell(0, UUID.self)
        let user = try cell(4, UUID?.self)
        return .obj([
            "id": .string(try cell(1, UUID.self).uuidString.lowercased()), "type": "usage.threshold",
            "created_at": JSON(try cell(2, Date.self)),
            "company": .obj(["id": .string(company.uuidString.lowercased()), "name": .string(try cell(3, String.self))]),
            "user": try user.map { .obj(["id": .string($0.uuidString.lowercased()), "email": JSON(try cell(5, String?.self))]) } ?? .null,
            "scope": .string(try cell(6, String.self)), "feature": JSON(try cell(7, String?.self)),
            "window": .string(try cell(8, String.self)), "window_start": JSON(try cell(9, Date.self)),
            "window_end": JSON(try cell(10, Date.self)), "threshold": .int(Int64(try cell(11, Int32.self))),
            "used": .int(try cell(12, Int64.self)), "limit": .int(try cell(13, Int64.self)),
        ])
    }

    /// Where a page of the newest-first list stops: the last row's `created_at` (microseconds
    /// since 1970, exact) and id. Opaque to clients.
    struct Cursor: Sendable, Equatable {
        var micros: Int64
        var id: UUID

        init(micros: Int64, id: UUID) {
            self.micros = micros
            self.id = id
        }

        init?(_ text: String) {
            let parts = text.split(separator: "_", omittingEmptySubsequences: false)
            guard parts.count == 2, let micros = Int64(parts[0]), micros >= 0, let id = UUID(uuidString: String(parts[1])) else {
                return nil
            }
            self.init(micros: micros, id: id)
        }

        var text: String { "\(micros)_\(id.uuidString.lowercased())" }
    }

    /// One page of the company's notifications, newest first, each with its delivery state.
    /// With `detailed` false (a company's admin), `last_error` is in general words
    /// (``generalError(_:)``); the operator reads what the deliverer recorded.
    func list(
        company: UUID, status: String?, after cursor: Cursor?, limit: Int, detailed: Bool
    ) async throws -> (items: [JSON], next: Cursor?) {
        let afterMicros = cursor?.micros
        let afterID = cursor?.id
        return try await database.run { client in
            let rows = try await client.query(
                """
                SELECT \(unescaped: Self.payloadColumns), n.status, n.attempts, n.last_error, n.delivered_at,
                       n.next_attempt_at, (extract(epoch FROM n.created_at) * 1000000)::bigint
                  FROM \(unescaped: Self.payloadSource)
                 WHERE n.company_id = \(company)
                   AND (\(status)::text IS NULL OR n.status = \(status))
                   AND (\(afterMicros)::bigint IS NULL
                        OR (n.created_at, n.id) < (timestamptz 'epoch' + \(afterMicros) * interval '1 microsecond', \(afterID)))
                 ORDER BY n.created_at DESC, n.id DESC
                 LIMIT \(limit + 1)
                """, logger: logger)
            var items: [JSON] = []
            var last: Cursor?
            let n = Self.payloadColumnCount
            for try await row in rows {
                guard items.count < limit else { return (items, last) }
                let cells = row.makeRandomAccess()
                let status = try cells[n].decode(String.self)
                guard case .object(var fields) = try Self.payload(row) else { continue }
                fields += [
                    .init("status", .string(status)), .init("attempts", .int(Int64(try cells[n + 1].decode(Int32.self)))),
                    .init("last_error", JSON(try cells[n + 2].decode(String?.self).map { detailed ? $0 : Self.generalError($0) })),
                    .init("delivered_at", JSON(try cells[n + 3].decode(Date?.self))),
                    .init("next_attempt_at", status == "pending" ? JSON(try cells[n + 4].decode(Date.self)) : .null),
                ]
                items.append(.object(fields))
                last = Cursor(micros: try cells[n + 5].decode(Int64.self), id: try cells[1].decode(UUID.self))
            }
            return (items, nil)
        }
    }

    /// A delivery error as a company admin reads it (SPEC §9): `receiver answered 500`, `timed
    /// out`, `receiver unreachable`; the receiver's address and library errors stay with the
    /// operator and the logs.
    static func generalError(_ recorded: String) -> String {
        if recorded.hasPrefix("HTTP "), let status = Int(recorded.dropFirst(5).prefix(3)) { return "receiver answered \(status)" }
        if recorded == "no signing secret" { return "not sent: the gateway has no signing secret configured" }
        let lowered = recorded.lowercased()
        if lowered.contains("in time") || lowered.contains("timed out") || lowered.contains("timeout") || lowered.contains("stalled") {
            return "timed out"
        }
        return "receiver unreachable"
    }

    /// Deletes delivered and failed rows older than `days` (`notifications.retentionDays`) whose
    /// window has ended (so a refund and a second crossing in a long window cannot notify twice);
    /// returns how many. Pending rows are kept whatever their age.
    @discardableResult
    func purge(olderThanDays days: Int) async throws -> Int {
        try await database.write { connection in
            let rows = try await connection.query(
                """
                WITH gone AS (
                    DELETE FROM notifications
                     WHERE status IN ('delivered', 'failed')
                       AND window_end < now()
                       AND coalesce(delivered_at, next_attempt_at, created_at) < now() - \(days) * interval '1 day'
                    RETURNING 1)
                SELECT count(*)::bigint FROM gone
                """, logger: logger)
            for try await count in rows.decode(Int64.self) { return Int(count) }
            return 0
        }
    }
}
