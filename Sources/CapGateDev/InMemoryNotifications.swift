import CapGate
import Foundation

/// A company's threshold notifications (SPEC §9) as a list of rows with their delivery state,
/// listed newest first (`created_at`, then id, both descending, as PostgreSQL orders them) a page
/// at a time after a cursor, as ``NotificationReading`` asks.
///
/// Not modelled: how rows come to be (the admission's threshold crossings, in SQL) and their
/// delivery (the deliverer's claims, retries and several gateways sharing the outbox), which
/// only the integration layer proves; here the test writes the rows as they would stand.
package struct InMemoryNotifications: NotificationReading {
    package struct Row: Sendable {
        package var payload: NotificationPayload
        package var status: String
        package var attempts: Int64
        /// What the deliverer recorded (the operator reads it whole).
        package var lastError: String?
        package var deliveredAt: Date?
        package var nextAttemptAt: Date?

        package init(
            payload: NotificationPayload, status: String, attempts: Int64, lastError: String? = nil, deliveredAt: Date? = nil,
            nextAttemptAt: Date? = nil
        ) {
            self.payload = payload
            self.status = status
            self.attempts = attempts
            self.lastError = lastError
            self.deliveredAt = deliveredAt
            self.nextAttemptAt = nextAttemptAt
        }

        /// Where the row sorts: its time in microseconds, then its id as PostgreSQL compares uuids.
        var key: (Int64, String) {
            (Int64((payload.createdAt.timeIntervalSince1970 * 1_000_000).rounded()), payload.id.uuidString.lowercased())
        }
    }

    package var rows: [Row] = []

    package init(_ rows: [Row] = []) {
        self.rows = rows
    }

    package func list(
        company: UUID, status: String?, after cursor: NotificationCursor?, limit: Int, detailed: Bool
    ) async throws -> (items: [JSON], next: NotificationCursor?) {
        let after = cursor.map { ($0.micros, $0.id.uuidString.lowercased()) }
        let matching = rows.filter { row in
            row.payload.companyID == company && (status == nil || row.status == status) && (after.map { row.key < $0 } ?? true)
        }
        .sorted { $0.key > $1.key }
        let page = matching.prefix(limit)
        let items = page.map { row in
            NotificationPayload.listed(
                row.payload.json, status: row.status, attempts: row.attempts, lastError: row.lastError, deliveredAt: row.deliveredAt,
                nextAttemptAt: row.status == "pending" ? row.nextAttemptAt : nil, detailed: detailed)
        }
        let next = matching.count > limit ? page.last.map { NotificationCursor(micros: $0.key.0, id: $0.payload.id) } : nil
        return (items, next)
    }
}
