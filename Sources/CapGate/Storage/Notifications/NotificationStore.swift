import Foundation
import Logging
import PostgresNIO

/// The notification rows of SPEC §9 as JSON: the webhook payload the deliverer signs and the
/// admin read (`GET /admin/v1/companies/{id}/notifications`) share one column list and one
/// builder, so what an admin reads is what the receiver got.
struct NotificationStore: NotificationReading {
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
        let user = try cell(4, UUID?.self)
        return NotificationPayload(
            companyID: try cell(0, UUID.self), id: try cell(1, UUID.self), createdAt: try cell(2, Date.self),
            companyName: try cell(3, String.self), user: try user.map { ($0, try cell(5, String?.self)) },
            scope: try cell(6, String.self), feature: try cell(7, String?.self), window: try cell(8, String.self),
            windowStart: try cell(9, Date.self), windowEnd: try cell(10, Date.self), threshold: Int64(try cell(11, Int32.self)),
            used: try cell(12, Int64.self), limit: try cell(13, Int64.self)
        ).json
    }

    typealias Cursor = NotificationCursor

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
                let payload = try Self.payload(row)
                items.append(
                    NotificationPayload.listed(
                        payload, status: status, attempts: Int64(try cells[n + 1].decode(Int32.self)),
                        lastError: try cells[n + 2].decode(String?.self), deliveredAt: try cells[n + 3].decode(Date?.self),
                        nextAttemptAt: status == "pending" ? try cells[n + 4].decode(Date.self) : nil, detailed: detailed))
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
