import Foundation
import Logging
import PostgresNIO

/// A call whose client left (SPEC §14): its concurrency slot is freed now (`capgate_rate_end`
/// with -2); the rest of its end (its row, its token hold) comes with its settlement.
struct RateEnd: Sendable {
    var companyID: UUID
    var ledgerID: Int64
    var tokens: Int64
}

extension MeteringStore {
    /// Slots of calls whose client left, freed in batches while one is in flight (no gathering
    /// wait).
    static func rateEndQueue(database: Database) -> BatchQueue<RateEnd, Void> {
        BatchQueue(maxBatch: Self.maxBatch) { items in
            do {
                try await database.run { client in
                    _ = try await client.execute(RateEndStatement(items: items), logger: database.logger).collect()
                }
                return items.map { _ in .success(()) }
            } catch {
                // The slot comes back at its lease (rate.leaseSeconds), the hold with the minute's end.
                database.logger.warning("could not end calls in their rate windows", metadata: ["calls": "\(items.count)"])
                return items.map { _ in .failure(error) }
            }
        }
    }

    /// Frees a call's concurrency slot now (its client left); its tokens are settled at its end.
    public func freeSlot(companyID: UUID, ledgerID: Int64) async {
        _ = try? await rateEnds.submit(RateEnd(companyID: companyID, ledgerID: ledgerID, tokens: -2))
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

/// `capgate_rate_end`: many calls ended in their rate windows at once.
struct RateEndStatement: PostgresPreparedStatement {
    static let sql = "SELECT capgate_rate_end($1, $2, $3)"
    typealias Row = Void

    var items: [RateEnd]

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 3)
        bindings.append(items.map(\.companyID))
        bindings.append(items.map(\.ledgerID))
        bindings.append(items.map(\.tokens))
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws {}
}
