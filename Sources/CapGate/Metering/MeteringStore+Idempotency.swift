import Foundation
import Logging
import NIOCore
import PostgresNIO

extension MeteringStore {
    /// Keeps the answer of the attempt `requestID` that holds `key` and succeeded
    /// (`capgate_idempotency_answer`); `body` nil: too large to keep (a retry gets 409). Awaited
    /// before the answer's last byte goes out, so a retry sent after the answer finds it.
    @discardableResult
    public func keepAnswer(
        companyID: UUID, userID: UUID, key: String, requestID: String, status: Int, contentType: String?, body: ByteBuffer?
    ) async throws -> Bool {
        try await Self.keepAnswer(
            companyID: companyID, userID: userID, key: key, requestID: requestID, status: status, contentType: contentType, body: body,
            database: database)
    }

    @discardableResult
    static func keepAnswer(
        companyID: UUID, userID: UUID, key: String, requestID: String, status: Int, contentType: String?, body: ByteBuffer?,
        database: Database
    ) async throws -> Bool {
        let status32 = Int32(clamping: status)
        return try await database.write { connection in
            let rows = try await connection.query(
                """
                SELECT capgate_idempotency_answer(\(companyID), \(userID), \(key), \(requestID), \(status32), \(contentType), \(body))
                """,
                logger: database.logger
            )
            for try await kept in rows.decode(Bool.self) { return kept }
            return false
        }
    }

    /// Writes that found the database unavailable wait in the spool (or in memory without one).
    var pendingWrites: PendingWrites { PendingWrites(database: database, spool: spool) }

    /// Forgets `Idempotency-Key`s older than 24 hours, in slices of `slice` rows; returns how many.
    public func purgeIdempotencyKeys(at: Date = Date(), slice: Int = 5_000) async throws -> Int {
        var total = 0
        while true {
            let limit = Int32(clamping: slice)
            let deleted = try await database.write { connection in
                let rows = try await connection.query("SELECT capgate_idempotency_purge(\(at), \(limit))", logger: database.logger)
                for try await count in rows.decode(Int32.self) { return Int(count) }
                return 0
            }
            total += deleted
            if deleted < slice { return total }
        }
    }
}

extension MeteringStore {
    /// Forgets `Idempotency-Key`s older than 24 hours (SPEC §2) every `interval`, in every
    /// `capgate serve`; several gateways purging at once skip each other's rows.
    func idempotencyPurgeJob(interval: Duration, logger: Logger) -> PeriodicJob {
        PeriodicJob(interval: interval) {
            do {
                let purged = try await purgeIdempotencyKeys()
                if purged > 0 { logger.info("idempotency keys forgotten", metadata: ["keys": "\(purged)"]) }
            } catch {
                logger.warning("idempotency key purge failed; retrying at the next interval")
            }
        }
    }
}
