import Foundation
import NIOCore
import PostgresNIO
import Synchronization

/// A check of an API key before its request's body is read: an unknown, revoked or disabled key
/// gets its 401 without the gateway buffering a byte of the body.
///
/// Keys found valid are remembered for `lifetime` (by their SHA-256, never the key), so a key
/// costs one extra round trip per 10 minutes, not per call (measured: with a minute, the
/// benchmark's 10,000 rotated keys kept missing and c=64 fell by a third); the admission still
/// checks the key in its own transaction, so a revocation applies to the next call whatever this
/// remembers. Nothing is remembered of a key found invalid (a key created a moment ago works at
/// once).
public final class KnownKeys: Sendable {
    let database: Database
    let lifetime: Duration
    let capacity: Int
    /// Where a used key is noted for its `last_used_at` (SPEC §13); nil: not noted.
    let usage: KeyUsage?
    /// A valid key's hash → until when it is remembered, its company and its id.
    private let known: Mutex<[ByteBuffer: (until: ContinuousClock.Instant, company: UUID, id: UUID)]> = Mutex([:])

    public init(database: Database, lifetime: Duration = .seconds(600), capacity: Int = 100_000, usage: KeyUsage? = nil) {
        self.database = database
        self.usage = usage
        self.lifetime = lifetime
        self.capacity = capacity
    }

    /// The key's company (for its share of the gateway, before the admission confirms it); throws
    /// the 401 for a key that is unknown, revoked, expired or whose user is disabled, 503 when the
    /// database cannot say. A key remembered as valid may have expired since: the admission, which
    /// reads the key again, answers its 401.
    @discardableResult
    public func check(_ key: String) async throws -> UUID {
        let hash = ApiKeyGenerator.hash(key)
        let now = ContinuousClock.now
        let fresh = known.withLock { known -> (company: UUID, id: UUID)? in
            guard let entry = known[hash] else { return nil }
            if entry.until > now { return (entry.company, entry.id) }
            known[hash] = nil
            return nil
        }
        if let fresh {
            usage?.record(fresh.id)
            return fresh.company
        }
        let database = self.database
        let auth = try await database.run { client -> (KeyCheck, UUID?, UUID?) in
            let rows = try await client.query(
                """
                SELECT capgate_key_check(true, k.revoked_at, k.expires_at, u.disabled, now()), k.company_id, k.id
                  FROM api_keys k JOIN users u ON u.company_id = k.company_id AND u.id = k.user_id
                 WHERE k.key_hash = \(hash)
                """,
                logger: database.logger
            )
            for try await (auth, company, id) in rows.decode((String, UUID, UUID).self) { return (KeyCheck(sql: auth), company, id) }
            return (.unknownKey, nil, nil)
        }
        guard auth.0 == .ok, let company = auth.1, let id = auth.2 else { throw Authenticator.keyError(auth.0) }
        usage?.record(id)
        let until = now + lifetime
        known.withLock { known in
            if known.count >= capacity { known.removeAll(keepingCapacity: true) }
            known[hash] = (until, company, id)
        }
        return company
    }
}
