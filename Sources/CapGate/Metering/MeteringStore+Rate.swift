import Foundation
import Logging
import PostgresNIO

/// A call whose concurrency slot is freed (SPEC §14, `capgate_rate_end`).
struct RateEnd: Sendable {
    var companyID: UUID
    var ledgerID: Int64
}

extension MeteringStore {
    /// Slots are freed in batches while one is in flight (no gathering wait: the caller's answer
    /// ends only after its own is written).
    static func rateEndQueue(database: Database) -> BatchQueue<RateEnd, Void> {
        BatchQueue(maxBatch: Self.maxBatch) { items in
            do {
                try await database.run { client in
                    _ = try await client.execute(RateEndStatement(items: items), logger: database.logger).collect()
                }
                return items.map { _ in .success(()) }
            } catch {
                // The slot comes back at its lease (rate.leaseSeconds).
                database.logger.warning("could not end calls in their rate windows", metadata: ["calls": "\(items.count)"])
                return items.map { _ in .failure(error) }
            }
        }
    }

    /// Frees a call's concurrency slot: before its answer ends, so that a caller who saw the
    /// answer end finds the slot free, or when its client left. (Its token hold is settled by its
    /// settlement.) A failure is logged, not thrown: the slot then frees at its lease.
    public func freeSlot(companyID: UUID, ledgerID: Int64) async {
        _ = try? await rateEnds.submit(RateEnd(companyID: companyID, ledgerID: ledgerID))
    }

    /// Removes the rows of calls a dead gateway never ended, once their lease is over (they no
    /// longer count; an hourly job of every gateway).
    public func purgeRateCalls() async throws {
        try await database.run { client in
            _ = try await client.query("DELETE FROM rate_calls WHERE lease_until < now()", logger: database.logger).collect()
        }
    }

    /// Writes `rate.leaseSeconds` where the admission functions read it (config_versions).
    public func setSlotLease(seconds: Int) async throws {
        let value = Int32(clamping: seconds)
        try await database.run { client in
            _ = try await client.query(
                "UPDATE config_versions SET slot_lease_seconds = \(value) WHERE singleton AND slot_lease_seconds <> \(value)",
                logger: database.logger
            ).collect()
        }
    }
}

/// `capgate_rate_end`: many calls' slots freed at once.
struct RateEndStatement: PostgresPreparedStatement {
    static let sql = "SELECT capgate_rate_end($1, $2)"
    typealias Row = Void

    var items: [RateEnd]

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 2)
        bindings.append(items.map(\.companyID))
        bindings.append(items.map(\.ledgerID))
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws {}
}
