import Foundation
import PostgresNIO

/// What authentication asks of the database (SPEC §2): the API key behind a hash, and whether a
/// token's user is a member of its company. ``PostgresCredentials`` reads the tables;
/// `CapGateDev`'s in-memory store answers from plain values, so routes behind
/// ``AuthMiddleware`` are tested with real credentials and no database.
package protocol CredentialStore: Sendable {
    /// The key whose SHA-256 is `hash`, with its user and whether it may be used now; nil when
    /// no key has that hash.
    func key(hash: ByteBuffer) async throws -> StoredKey?
    /// The role and state of `user` in `company`; nil when the company has no such user.
    func member(company: UUID, user: UUID) async throws -> StoredMember?
}

/// An API key as authentication reads it.
package struct StoredKey: Sendable, Equatable {
    package var companyID: UUID
    package var userID: UUID
    package var keyID: UUID
    /// The user's role (`member` or `admin`).
    package var role: UserIdentity.Role
    /// The features the key may be charged to; nil: unbound.
    package var features: [String]?
    /// Whether the key may be used now (`capgate_key_check`'s answer).
    package var check: KeyCheck

    package init(companyID: UUID, userID: UUID, keyID: UUID, role: UserIdentity.Role, features: [String]?, check: KeyCheck) {
        self.companyID = companyID
        self.userID = userID
        self.keyID = keyID
        self.role = role
        self.features = features
        self.check = check
    }
}

/// A user of a company as authentication reads it.
package struct StoredMember: Sendable, Equatable {
    package var role: UserIdentity.Role
    package var disabled: Bool

    package init(role: UserIdentity.Role, disabled: Bool) {
        self.role = role
        self.disabled = disabled
    }
}

/// The credentials in PostgreSQL: `api_keys` and `users`, the key's state by `capgate_key_check`.
struct PostgresCredentials: CredentialStore {
    let database: Database

    func key(hash: ByteBuffer) async throws -> StoredKey? {
        let row = try await database.run { client in
            let rows = try await client.query(
                """
                SELECT k.company_id, k.user_id, u.role, k.features, k.id,
                       capgate_key_check(true, k.revoked_at, k.expires_at, u.disabled, now())
                  FROM api_keys k JOIN users u ON u.company_id = k.company_id AND u.id = k.user_id
                 WHERE k.key_hash = \(hash)
                """,
                logger: database.logger
            )
            for try await row in rows.decode((UUID, UUID, String, [String]?, UUID, String).self) { return Optional(row) }
            return nil
        }
        guard let (company, user, role, features, keyID, checked) = row else { return nil }
        return StoredKey(
            companyID: company, userID: user, keyID: keyID, role: UserIdentity.Role(sql: role), features: features,
            check: KeyCheck(sql: checked))
    }

    func member(company: UUID, user: UUID) async throws -> StoredMember? {
        let row = try await database.run { client -> (String, Bool)? in
            let rows = try await client.query(
                "SELECT role, disabled FROM users WHERE company_id = \(company) AND id = \(user)",
                logger: database.logger
            )
            for try await row in rows.decode((String, Bool).self) { return row }
            return nil
        }
        return row.map { StoredMember(role: UserIdentity.Role(sql: $0.0), disabled: $0.1) }
    }
}
