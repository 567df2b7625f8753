import Foundation
import Logging
import PostgresNIO

/// API keys (SPEC §5, §13): created (the secret shown once, only its hash stored), listed,
/// revoked and rotated, each change audited in its own transaction.
extension TenantStore {
    static let keyColumns = "id, user_id, prefix, created_at, revoked_at, features, name, expires_at, last_used_at"

    /// A row of ``keyColumns``.
    typealias KeyRow = (UUID, UUID, String, Date, Date?, [String]?, String?, Date?, Date?)

    static func keyRecord(_ r: KeyRow) -> ApiKeyRecord {
        ApiKeyRecord(
            id: r.0, userID: r.1, prefix: r.2, createdAt: r.3, revokedAt: r.4, features: r.5, key: nil, name: r.6, expiresAt: r.7,
            lastUsedAt: r.8)
    }

    /// The settings a new key is made with (SPEC §8, §13).
    public struct KeySettings: Sendable {
        /// The features the key may be charged to; nil: unbound.
        public var features: [String]?
        /// A label for people.
        public var name: String?
        /// When it stops working; nil: never.
        public var expiresAt: Date?

        public init(features: [String]? = nil, name: String? = nil, expiresAt: Date? = nil) {
            self.features = features
            self.name = name
            self.expiresAt = expiresAt
        }
    }

    /// Creates a key for a user of the company; the key itself is returned once and never stored.
    /// `features`: the features the key may be charged to (SPEC §8), nil for an unbound key; the
    /// caller checks that they exist.
    public func createKey(company: UUID, user: UUID, features: [String]? = nil) async throws -> ApiKeyRecord {
        try await createKey(company: company, user: user, settings: KeySettings(features: features))
    }

    /// Creates a key with `settings`, audited as `api_key.create` when `actor` is set.
    public func createKey(company: UUID, user: UUID, settings: KeySettings, by actor: AuditActor? = nil) async throws -> ApiKeyRecord {
        try await database.audited(actor) { connection in
            let record = try await Self.insertKey(company: company, user: user, settings: settings, on: connection, logger: self.logger)
            let after = try await AuditLog.snapshot(AuditLog.apiKey(company, record.id), on: connection, logger: self.logger)
            return (
                record, AuditEntry(action: "api_key.create", companyID: company, targetID: record.id.lowercased, before: nil, after: after)
            )
        }
    }

    /// Inserts a new key; its secret is in the answer only.
    static func insertKey(
        company: UUID, user: UUID, settings: KeySettings, on connection: PostgresConnection, logger: Logger
    ) async throws -> ApiKeyRecord {
        let (key, prefix, hash) = ApiKeyGenerator.make()
        let id = UUID()
        let rows = try await connection.query(
            """
            INSERT INTO api_keys (company_id, id, user_id, prefix, key_hash, features, name, expires_at)
            VALUES (\(company), \(id), \(user), \(prefix), \(hash), \(settings.features), \(settings.name), \(settings.expiresAt))
            RETURNING \(unescaped: keyColumns)
            """,
            logger: logger
        )
        for try await r in rows.decode(KeyRow.self) {
            var record = keyRecord(r)
            record.key = key
            return record
        }
        throw DatabaseError.other("INSERT INTO api_keys returned no row")
    }

    /// Every key of the company, revoked and expired ones included; never a secret.
    public func keys(company: UUID) async throws -> [ApiKeyRecord] {
        try await database.run { client in
            var out: [ApiKeyRecord] = []
            let rows = try await client.query(
                "SELECT \(unescaped: Self.keyColumns) FROM api_keys WHERE company_id = \(company) ORDER BY created_at, id",
                logger: logger
            )
            for try await r in rows.decode(KeyRow.self) { out.append(Self.keyRecord(r)) }
            return out
        }
    }

    /// Revokes a key at once; revoking twice keeps the first time. nil when unknown.
    public func revokeKey(company: UUID, id: UUID, by actor: AuditActor? = nil) async throws -> ApiKeyRecord? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.apiKey(company, id)), on: connection, logger: self.logger)
            guard before != nil else { return (nil, nil) }
            let rows = try await connection.query(
                """
                UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
                 WHERE company_id = \(company) AND id = \(id)
                RETURNING \(unescaped: Self.keyColumns)
                """,
                logger: self.logger
            )
            let record = try await rows.decode(KeyRow.self).collect().first.map(Self.keyRecord)
            let after = try await AuditLog.snapshot(AuditLog.apiKey(company, id), on: connection, logger: self.logger)
            return (record, AuditEntry(action: "api_key.revoke", companyID: company, targetID: id.lowercased, before: before, after: after))
        }
    }

    /// Why a key cannot be rotated.
    public enum RotateRefusal: Error, Sendable { case unknown, revoked, expired }

    /// A new key for the same user with the same name, features and expiry (SPEC §13); the old
    /// one keeps working for `grace` seconds (its `expires_at` moves to now + grace, never later
    /// than it was). Returns the new key, its secret shown once.
    public func rotateKey(company: UUID, id: UUID, grace: Int64, by actor: AuditActor? = nil) async throws -> ApiKeyRecord {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.apiKey(company, id)), on: connection, logger: self.logger)
            let rows = try await connection.query(
                """
                SELECT \(unescaped: Self.keyColumns), expires_at <= now() FROM api_keys WHERE company_id = \(company) AND id = \(id)
                """, logger: self.logger)
            guard before != nil,
                let (r0, r1, r2, r3, r4, r5, r6, r7, r8, expired) = try await rows.decode(
                    (UUID, UUID, String, Date, Date?, [String]?, String?, Date?, Date?, Bool?).self
                ).collect().first
            else { throw RotateRefusal.unknown }
            let old = Self.keyRecord((r0, r1, r2, r3, r4, r5, r6, r7, r8))
            if old.revokedAt != nil { throw RotateRefusal.revoked }
            if expired == true { throw RotateRefusal.expired }
            let fresh = try await Self.insertKey(
                company: company, user: old.userID,
                settings: KeySettings(features: old.features, name: old.name, expiresAt: old.expiresAt), on: connection,
                logger: self.logger)
            try await connection.query(
                """
                UPDATE api_keys SET expires_at = LEAST(coalesce(expires_at, 'infinity'), now() + make_interval(secs => \(grace)))
                 WHERE company_id = \(company) AND id = \(id)
                """, logger: self.logger)
            let after = try await AuditLog.snapshot(
                """
                SELECT jsonb_build_object('old', to_jsonb(o) - 'key_hash', 'new', to_jsonb(n) - 'key_hash')::text
                  FROM api_keys o, api_keys n WHERE o.id = \(id) AND n.id = \(fresh.id)
                """, on: connection, logger: self.logger)
            return (fresh, AuditEntry(action: "api_key.rotate", companyID: company, targetID: id.lowercased, before: before, after: after))
        }
    }
}
