import Foundation

/// What the notifications route (SPEC §9) asks of its store: ``NotificationStore`` reads
/// PostgreSQL; `CapGateDev`'s in-memory store a list of rows.
package protocol NotificationReading: Sendable {
    /// One page of `company`'s notifications (of `status` when given) after `cursor`, newest
    /// first, at most `limit`, and the cursor of the next page when there is one. With `detailed`
    /// false (a company's admin), `last_error` is in general words.
    func list(
        company: UUID, status: String?, after cursor: NotificationCursor?, limit: Int, detailed: Bool
    ) async throws -> (items: [JSON], next: NotificationCursor?)
}

/// Where a page of the newest-first list stops: the last row's `created_at` (microseconds since
/// 1970, exact) and id. Opaque to clients.
package struct NotificationCursor: Sendable, Equatable {
    package var micros: Int64
    package var id: UUID

    package init(micros: Int64, id: UUID) {
        self.micros = micros
        self.id = id
    }

    package init?(_ text: String) {
        let parts = text.split(separator: "_", omittingEmptySubsequences: false)
        guard parts.count == 2, let micros = Int64(parts[0]), micros >= 0, let id = UUID(uuidString: String(parts[1])) else {
            return nil
        }
        self.init(micros: micros, id: id)
    }

    package var text: String { "\(micros)_\(id.uuidString.lowercased())" }
}

/// A notification as SPEC §9's webhook body writes it; the admin read adds its delivery state
/// (``listed(_:status:attempts:lastError:deliveredAt:nextAttemptAt:detailed:)``). Both stores
/// and the deliverer build it here, so what an admin reads is what the receiver got.
package struct NotificationPayload: Sendable {
    package var companyID: UUID
    package var id: UUID
    package var createdAt: Date
    package var companyName: String
    /// The user of a user's counter, with its email; nil for the company's.
    package var user: (id: UUID, email: String?)?
    package var scope: String
    package var feature: String?
    /// `period` or `day`.
    package var window: String
    package var windowStart: Date
    package var windowEnd: Date
    package var threshold: Int64
    package var used: Int64
    package var limit: Int64

    package init(
        companyID: UUID, id: UUID, createdAt: Date, companyName: String, user: (id: UUID, email: String?)?, scope: String,
        feature: String?, window: String, windowStart: Date, windowEnd: Date, threshold: Int64, used: Int64, limit: Int64
    ) {
        self.companyID = companyID
        self.id = id
        self.createdAt = createdAt
        self.companyName = companyName
        self.user = user
        self.scope = scope
        self.feature = feature
        self.window = window
        self.windowStart = windowStart
        self.windowEnd = windowEnd
        self.threshold = threshold
        self.used = used
        self.limit = limit
    }

    /// The webhook body.
    package var json: JSON {
        .obj([
            "id": .string(id.uuidString.lowercased()), "type": "usage.threshold", "created_at": JSON(createdAt),
            "company": .obj(["id": .string(companyID.uuidString.lowercased()), "name": .string(companyName)]),
            "user": user.map { .obj(["id": .string($0.id.uuidString.lowercased()), "email": JSON($0.email)]) } ?? .null,
            "scope": .string(scope), "feature": JSON(feature), "window": .string(window), "window_start": JSON(windowStart),
            "window_end": JSON(windowEnd), "threshold": .int(threshold), "used": .int(used), "limit": .int(limit),
        ])
    }

    /// A webhook body with the row's delivery state, as the admin read lists it; `last_error` in
    /// general words unless `detailed` (the operator's read).
    package static func listed(
        _ payload: JSON, status: String, attempts: Int64, lastError: String?, deliveredAt: Date?, nextAttemptAt: Date?,
        detailed: Bool
    ) -> JSON {
        guard case .object(let fields) = payload else { return payload }
        return .object(
            fields + [
                .init("status", .string(status)), .init("attempts", .int(attempts)),
                .init("last_error", JSON(lastError.map { detailed ? $0 : NotificationStore.generalError($0) })),
                .init("delivered_at", JSON(deliveredAt)), .init("next_attempt_at", JSON(nextAttemptAt)),
            ])
    }
}
