import Foundation
import Logging
import PostgresNIO

/// The write transactions of the gateway's role that are open on the primary, by backend and
/// transaction id: what the ledger search of an interrupted admission waits for (issue #46,
/// finding 2).
///
/// An admission's commit that waits for a synchronous standby holds its rows invisible to every
/// other session until the standby confirms, and `statement_timeout` does not end that wait. A
/// search for its charges made meanwhile finds nothing, and the charge then lands on calls that
/// were answered 503: the gateway stopped waiting at `database.timeout`, its connection may since
/// have closed (a restart, the 30 s backstop), and PostgreSQL does not notice a closed client
/// while it waits for the standby. So the search first takes the transactions that hold a
/// transaction id (that wrote) in this database, as the gateway's role, and waits until each of
/// them ended: committed and visible, or rolled back. The admission's transaction is among them
/// if it is still open, since the search runs after its statement's `statement_timeout` ran out
/// (the statement ended, and only its commit can still be pending).
///
/// The wait is bounded: transactions still open after it (a standby that stays away) leave the
/// give-back undone, as ``Pending``, and it is tried again later (the spool keeps it). A session
/// of the same role holding a write transaction open by hand delays give-backs the same way.
enum OpenWrites {
    /// Transactions still open after the wait.
    struct Pending: Error, CustomStringConvertible {
        let count: Int
        var description: String { "\(count) write transactions are still open (a commit waiting for a synchronous standby?)" }
    }

    /// How long one search waits for the open transactions, and how often it looks.
    static let wait = Duration.seconds(5)
    static let interval = Duration.milliseconds(50)

    /// `backend pid:transaction id` of every other write transaction of this role in this
    /// database (the pair names one transaction: a backend's pid is reused only by a later
    /// backend, whose transactions have other ids).
    static let openSQL: PostgresQuery = """
        SELECT pid::text || ':' || backend_xid::text FROM pg_stat_activity
         WHERE datname = current_database() AND usename = current_user
           AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
        """

    /// Returns once every write transaction open when it was called has ended; throws
    /// ``Pending`` when some are still open after `wait`.
    static func awaitEnd(database: Database, wait: Duration = OpenWrites.wait) async throws {
        let logger = database.logger
        let open = try await database.run { client in
            try await client.query(openSQL, logger: logger).decode(String.self).collect()
        }
        guard !open.isEmpty else { return }
        let until = ContinuousClock.now + wait
        while true {
            let left = try await database.run { client in
                let rows = try await client.query(
                    """
                    SELECT count(*)::int8 FROM pg_stat_activity
                     WHERE backend_xid IS NOT NULL AND pid::text || ':' || backend_xid::text = ANY(\(open))
                    """, logger: logger)
                for try await count in rows.decode(Int64.self) { return Int(count) }
                return 0
            }
            if left == 0 { return }
            guard ContinuousClock.now < until else {
                logger.warning(
                    "a give-back waits: transactions that were open when it began have not ended (a commit waiting for a synchronous standby?); it is tried again later",
                    metadata: ["open_transactions": "\(left)"])
                throw Pending(count: left)
            }
            try await Task.sleep(for: interval)
        }
    }
}
