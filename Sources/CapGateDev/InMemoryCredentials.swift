import CapGate
import Foundation
import NIOCore

/// API keys and a token's user answered from an ``InMemoryTenants``: a key found by the hash of
/// its secret, its state by the rule `capgate_key_check` writes (revoked, then expired, then its
/// user disabled), at the time of the call.
///
/// Not modelled: the key's `last_used_at` (the gateway notes it through ``KeyUsage`` in
/// PostgreSQL), and a change made while a request runs (these values do not change).
package struct InMemoryCredentials: CredentialStore {
    package var tenants: InMemoryTenants

    package init(_ tenants: InMemoryTenants) {
        self.tenants = tenants
    }

    package func key(hash: ByteBuffer) async throws -> StoredKey? {
        guard let key = tenants.keys.first(where: { ApiKeyGenerator.hash($0.secret) == hash }),
            let user = tenants.users.first(where: { $0.companyID == key.companyID && $0.id == key.userID })
        else { return nil }
        let now = Date()
        let check: KeyCheck =
            if key.revokedAt != nil {
                .revokedKey
            } else if let expires = key.expiresAt, expires <= now {
                .expiredKey
            } else if user.disabled {
                .disabledUser
            } else {
                .ok
            }
        return StoredKey(companyID: key.companyID, userID: key.userID, keyID: key.id, role: user.role, features: key.features, check: check)
    }

    package func member(company: UUID, user: UUID) async throws -> StoredMember? {
        tenants.users.first { $0.companyID == company && $0.id == user }.map { StoredMember(role: $0.role, disabled: $0.disabled) }
    }
}
