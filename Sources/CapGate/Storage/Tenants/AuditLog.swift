import Foundation
import Logging
import PostgresNIO

/// Who made a change and in which request (SPEC §13): an admin's user id, or the operator
/// token's name (`operator` for the unnamed `operator.token`).
public struct AuditActor: Sendable, Equatable {
    public var name: String
    public var requestID: String

    public init(name: String, requestID: String) {
        self.name = name
        self.requestID = requestID
    }
}

/// One change as the audit log records it. `before` and `after` are jsonb text of the row as
/// stored (nil before a create and after a delete), read with ``AuditLog/snapshot(_:on:logger:)``
/// whose queries leave out every secret (an API key's hash).
public struct AuditEntry: Sendable {
    public var action: String
    public var companyID: UUID?
    public var targetID: String
    public var before: String?
    public var after: String?
}

/// The audit log's writes: one row per change, in the change's own transaction, so a change that
/// fails (or rolls back) leaves none.
enum AuditLog {
    /// The one jsonb value `query` selects, as text; nil when it selects no row.
    static func snapshot(_ query: PostgresQuery, on connection: PostgresConnection, logger: Logger) async throws -> String? {
        let rows = try await connection.query(query, logger: logger)
        for try await text in rows.decode(String?.self) { return text }
        return nil
    }

    static func write(_ entry: AuditEntry, by actor: AuditActor, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            INSERT INTO audit_log (actor, company_id, action, target_id, before, after, request_id)
            VALUES (\(actor.name), \(entry.companyID), \(entry.action), \(entry.targetID), \(entry.before)::jsonb,
                    \(entry.after)::jsonb, \(actor.requestID))
            """, logger: logger)
    }

    /// `query` taking the row's lock, so `before` is what the change replaces.
    static func locked(_ query: PostgresQuery) -> PostgresQuery {
        PostgresQuery(unsafeSQL: query.sql + " FOR UPDATE", binds: query.binds)
    }

    // The rows as audited: every column but a secret.

    static func plan(_ id: String) -> PostgresQuery { "SELECT to_jsonb(p)::text FROM plans p WHERE p.id = \(id)" }
    static func product(_ id: String) -> PostgresQuery { "SELECT to_jsonb(p)::text FROM products p WHERE p.product_id = \(id)" }
    /// The purchase token (SPEC §12) is left out: it is what binds an App Store purchase to the company.
    static func company(_ id: UUID) -> PostgresQuery {
        "SELECT (to_jsonb(c) - 'app_account_token')::text FROM companies c WHERE c.id = \(id)"
    }
    static func user(_ company: UUID, _ id: UUID) -> PostgresQuery {
        "SELECT to_jsonb(u)::text FROM users u WHERE u.company_id = \(company) AND u.id = \(id)"
    }
    static func apiKey(_ company: UUID, _ id: UUID) -> PostgresQuery {
        "SELECT (to_jsonb(k) - 'key_hash')::text FROM api_keys k WHERE k.company_id = \(company) AND k.id = \(id)"
    }
    static func feature(_ id: String) -> PostgresQuery { "SELECT to_jsonb(f)::text FROM features f WHERE f.id = \(id)" }
    static func entitlement(_ plan: String, _ feature: String) -> PostgresQuery {
        "SELECT to_jsonb(e)::text FROM plan_features e WHERE e.plan_id = \(plan) AND e.feature_id = \(feature)"
    }
    static func route(_ id: String) -> PostgresQuery { "SELECT to_jsonb(r)::text FROM routes r WHERE r.id = \(id)" }
    /// The whole price book, one array.
    static let prices: PostgresQuery =
        "SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.model, p.effective_from), '[]')::text FROM prices p"
    /// The company's latest plan period (its plan, bounds and auto-renew).
    static func period(_ company: UUID) -> PostgresQuery {
        """
        SELECT to_jsonb(pp)::text FROM plan_periods pp WHERE pp.company_id = \(company)
         ORDER BY pp.started_at DESC LIMIT 1
        """
    }
}

extension Database {
    /// Runs `body` in one transaction with the audit row it returns (SPEC §13); with no actor (the
    /// dev seed, tests that call a store directly) or no entry, nothing is audited.
    func audited<T: Sendable>(
        _ actor: AuditActor?, _ body: @escaping @Sendable (PostgresConnection) async throws -> (T, AuditEntry?)
    ) async throws -> T {
        try await transaction { connection in
            let (result, entry) = try await body(connection)
            if let actor, let entry { try await AuditLog.write(entry, by: actor, on: connection, logger: self.logger) }
            return result
        }
    }
}

extension UUID {
    /// The id as the API writes it.
    var lowercased: String { uuidString.lowercased() }
}
