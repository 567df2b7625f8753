import Foundation
import Logging
import PostgresNIO

/// A call whose concurrency slot is freed (SPEC §14, `capgate_rate_end`).
struct RateEnd: Sendable {
    var companyID: UUID
    var ledgerID: Int64
}

extension MeteringStore {
    /// Frees a call's concurrency slot: noted before its answer ends, or when its client left,
    /// and written with this gateway's next admission transaction or within milliseconds
    /// (``SlotEnds``), so a call this gateway admits after the answer ended finds the slot free.
    /// (Its token hold is settled by its settlement.) A write that fails is tried again every second (``SlotEnds``).
    public func freeSlot(companyID: UUID, ledgerID: Int64) {
        slotEnds.add(RateEnd(companyID: companyID, ledgerID: ledgerID))
    }

    /// Notes that an admitted call holds a slot: its lease is renewed while it runs (``SlotEnds``).
    func slotTaken(companyID: UUID, ledgerID: Int64) -> SlotLease {
        slotEnds.taken(companyID: companyID, ledgerID: ledgerID)
    }

    /// Renews the leases of this gateway's calls in flight (a job every quarter of `rate.leaseSeconds`).
    public func renewSlotLeases(seconds: Int) async {
        await slotEnds.renew(leaseSeconds: seconds)
    }

    /// Removes the rows of calls a dead gateway never ended, once their lease is over (they no
    /// longer count; an hourly job of every gateway).
    public func purgeRateCalls() async throws {
        try await database.write { connection in
            _ = try await connection.query("DELETE FROM rate_calls WHERE lease_until < now()", logger: database.logger).collect()
        }
    }

    /// Writes `rate.leaseSeconds` where the admission functions read it (config_versions).
    public func setSlotLease(seconds: Int) async throws {
        let value = Int32(clamping: seconds)
        try await database.write { connection in
            _ = try await connection.query(
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
