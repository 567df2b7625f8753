import Foundation
import Logging
import PostgresNIO
import Synchronization

/// When each API key was last used (SPEC §13), kept apart from the admission: a call only adds
/// its key's id to a set in memory; ``flush()`` (a periodic job) writes the set in one UPDATE,
/// which touches a key at most once a minute (a key written less than a minute ago is left as
/// it is), so neither the admission's transaction nor its round trip grows.
public final class KeyUsage: Sendable {
    let database: Database
    /// Ids of keys used since the last flush; bounded (a flood of keys cannot grow it without end).
    private let used: Mutex<Set<UUID>> = Mutex([])
    let capacity: Int

    public init(database: Database, capacity: Int = 100_000) {
        self.database = database
        self.capacity = capacity
    }

    /// Notes that a call used the key `id`.
    public func record(_ id: UUID) {
        used.withLock { used in
            if used.count < capacity { used.insert(id) }
        }
    }

    /// Writes `last_used_at = now()` for the keys used since the last flush, except those written
    /// less than a minute ago; the number of keys written. Ids that could not be written (the
    /// database unreachable) are kept for the next flush.
    @discardableResult
    public func flush() async throws -> Int {
        let ids = used.withLock { used -> [UUID] in
            defer { used.removeAll(keepingCapacity: true) }
            return Array(used)
        }
        guard !ids.isEmpty else { return 0 }
        let database = self.database
        do {
            return try await database.write { connection in
                try await connection.query(
                    """
                    UPDATE api_keys SET last_used_at = now()
                     WHERE id = ANY (\(ids)) AND (last_used_at IS NULL OR last_used_at <= now() - interval '1 minute')
                    RETURNING 1
                    """, logger: database.logger
                ).collect().count
            }
        } catch {
            for id in ids { record(id) }
            throw error
        }
    }

    /// The flush every `interval` inside `serve`.
    func flushJob(interval: Duration, logger: Logger) -> PeriodicJob {
        PeriodicJob(interval: interval) {
            do {
                try await self.flush()
            } catch {
                logger.warning("last_used_at flush failed", metadata: ["error": "\(String(describing: error))"])
            }
        }
    }
}
