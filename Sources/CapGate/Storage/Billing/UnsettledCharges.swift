import Foundation
import Logging
import PostgresNIO

/// Charges whose provider answer was never recorded: the gateway admitted the call (the charge
/// is committed, counters include it) and then died, or lost the database, before it settled
/// the call or gave it back. Such a ledger row stays `charged` with `settled_at` and
/// `upstream_status` NULL. Counters still agree with the ledger (the row is a charge), so this
/// is not a mismatch; it is a call nobody knows the fate of, for an operator to decide:
///
/// - keep: the charge stands; `settled_at` is set and `upstream_status` stays NULL, which no
///   other path writes on a charged row (a provider settlement always records a status). The
///   export shows such a row as `kept`. A real settlement arriving later still overwrites it.
///   A cost hold still open on the row (SPEC §11: `hold_micros` set, `cost_source` NULL) is
///   charged as its cost (`cost_micros` = the hold, `cost_source` `hold`, as for an answer whose
///   usage cannot be known), and the company's and the user's counters move it from `cost_held`
///   to `cost_used` in the same transaction.
/// - refund: `capgate_refund(company, id, NULL, NULL, created_at)` gives the units back to both counters,
///   marks the row refunded, and marks its Idempotency-Key failed so a retry is a new attempt.
///
/// A charged row without `settled_at` is `pending` for ``defaultGrace`` after its `created_at`
/// (the call may still be streaming), `unsettled` after.
public struct UnsettledCharges: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// How long a charge may stay without settlement before it is reported (1 hour): far past
    /// `upstream.timeout` (600 s) for the answer's head; a stream that runs longer settles late
    /// and then shows as settled.
    public static let defaultGrace: TimeInterval = 3600

    /// A ledger row's settlement, as the events export shows it.
    public enum State: String, Sendable, CaseIterable {
        /// The provider's answer was recorded (or the charge was given back).
        case settled
        /// No answer recorded yet, within the grace time.
        case pending
        /// No answer recorded, older than the grace time.
        case unsettled
        /// Was unsettled; an operator kept the charge (`capgate unsettled keep`).
        case kept

        /// The state of a row with these columns at `now`.
        public static func of(
            outcome: String, settledAt: Date?, upstreamStatus: Int32?, createdAt: Date, now: Date, grace: TimeInterval = defaultGrace
        ) -> State {
            if outcome != "charged" { return .settled }
            if settledAt != nil { return upstreamStatus == nil ? .kept : .settled }
            return createdAt > now.addingTimeInterval(-grace) ? .pending : .unsettled
        }
    }

    /// One company's unsettled charges.
    public struct CompanySummary: Sendable, CustomStringConvertible {
        public var companyID: UUID
        public var count: Int64
        public var units: Int64
        public var oldestID: Int64
        public var oldestAt: Date
        /// The cost holds still open on these charges (SPEC §11).
        public var held: Micros = .zero

        public var description: String {
            "unsettled: company \(companyID.uuidString.lowercased()): \(count) charges, \(units) units, "
                + "oldest \(oldestID) at \(Timestamp.format(oldestAt))" + (held > .zero ? ", \(held.decimal) USD held" : "")
        }
    }

    /// One unsettled charge.
    public struct Charge: Sendable, CustomStringConvertible {
        public var id: Int64
        public var companyID: UUID
        public var userID: UUID
        public var units: Int32
        public var createdAt: Date
        public var method: String
        public var route: String
        public var requestID: String
        public var idempotencyKey: String?
        /// Its cost hold, while open (SPEC §11); nil when nothing is held.
        public var hold: Micros? = nil

        public var description: String {
            "\(id) company \(companyID.uuidString.lowercased()) user \(userID.uuidString.lowercased()) units \(units) "
                + "created \(Timestamp.format(createdAt)) \(method) \(route) request \(requestID)"
                + (idempotencyKey.map { " idempotency_key \($0)" } ?? "") + (hold.map { " hold \($0.decimal) USD" } ?? "")
        }
    }

    /// What `keep` or `refund` did with one ledger id.
    public struct Resolution: Sendable, CustomStringConvertible {
        public enum Outcome: Sendable, Equatable {
            case kept, refunded
            /// Already in the asked-for state (a repeated command): nothing changed.
            case already(String)
            /// Not acted on, with the reason.
            case skipped(String)
        }
        public var id: Int64
        public var companyID: UUID?
        public var outcome: Outcome
        /// For a kept charge whose cost hold was open: the hold, now charged as its cost.
        public var charged: Micros? = nil

        /// False when the id was skipped.
        public var done: Bool {
            if case .skipped = outcome { return false }
            return true
        }

        public var description: String {
            let company = companyID.map { " (company \($0.uuidString.lowercased()))" } ?? ""
            switch outcome {
            case .kept:
                return "kept \(id)\(company): the charge stands" + (charged.map { ", its hold of \($0.decimal) USD charged" } ?? "")
            case .refunded: return "refunded \(id)\(company): the units are given back"
            case .already(let what): return "\(id)\(company): \(what) already, nothing changed"
            case .skipped(let why): return "skipped \(id)\(company): \(why)"
            }
        }
    }

    /// Unsettled charges older than `olderThan` seconds, per company, oldest company first.
    public func summary(olderThan: TimeInterval = defaultGrace) async throws -> [CompanySummary] {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT company_id, count(*)::bigint, sum(units)::bigint,
                       (array_agg(id ORDER BY created_at, id))[1], min(created_at),
                       COALESCE(sum(hold_micros) FILTER (WHERE cost_source IS NULL), 0)::bigint
                  FROM capgate_unsettled_charges(clock_timestamp() - \(olderThan) * interval '1 second')
                 GROUP BY company_id
                 ORDER BY min(created_at), company_id
                """,
                logger: logger
            )
            var out: [CompanySummary] = []
            for try await (company, count, units, oldest, at, held) in rows.decode((UUID, Int64, Int64, Int64, Date, Int64).self) {
                out.append(
                    CompanySummary(companyID: company, count: count, units: units, oldestID: oldest, oldestAt: at, held: Micros(held)))
            }
            return out
        }
    }

    /// How many charges are unsettled for more than `olderThan` seconds, and the age in seconds of
    /// the oldest (0 when none): what `/metrics` shows (``GatewayMetrics/unsettled(count:oldestSeconds:)``).
    /// Found through the rollups (`capgate_unsettled_charges`, migration 0029): no index of the
    /// ledger covers unsettled rows (one would cost every admission an insert and every
    /// settlement its HOT update), the rollups count them per quarter hour, so this reads the
    /// ledger rows of the quarter hours that hold one, not the whole ledger.
    public func totals(olderThan: TimeInterval = defaultGrace) async throws -> (count: Int64, oldestSeconds: Double) {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT count(*)::bigint, coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
                  FROM capgate_unsettled_charges(clock_timestamp() - \(olderThan) * interval '1 second')
                """,
                logger: logger
            ).decode((Int64, Double).self).collect()
            return rows.first.map { (count: $0.0, oldestSeconds: $0.1) } ?? (0, 0)
        }
    }

    /// Unsettled charges older than `olderThan` seconds (of one company, or all), oldest first.
    public func list(company: UUID?, olderThan: TimeInterval = defaultGrace, limit: Int = 1000) async throws -> [Charge] {
        let limit = Int64(limit)
        return try await database.run { client in
            let rows = try await client.query(
                """
                SELECT id, company_id, user_id, units, created_at, method, route, request_id, idempotency_key,
                       CASE WHEN cost_source IS NULL THEN hold_micros END
                  FROM capgate_unsettled_charges(clock_timestamp() - \(olderThan) * interval '1 second', \(company)::uuid)
                 ORDER BY created_at, id
                 LIMIT \(limit)
                """,
                logger: logger
            )
            var out: [Charge] = []
            for try await r in rows.decode((Int64, UUID, UUID, Int32, Date, String, String, String, String?, Int64?).self) {
                out.append(
                    Charge(
                        id: r.0, companyID: r.1, userID: r.2, units: r.3, createdAt: r.4, method: r.5, route: r.6, requestID: r.7,
                        idempotencyKey: r.8, hold: r.9.map(Micros.init)))
            }
            return out
        }
    }

    /// Keeps each charge (it stands, marked settled without a provider status) if it is
    /// unsettled for `olderThan` seconds; `company` narrows the look-up to one company. An open
    /// cost hold is charged as the call's cost (``keep(_:on:olderThan:)``).
    public func keep(_ ids: [Int64], company: UUID? = nil, olderThan: TimeInterval = defaultGrace) async throws -> [Resolution] {
        try await resolve(ids, company: company, olderThan: olderThan, action: .keep) { connection, row in
            try await keep(row, on: connection, olderThan: olderThan)
        }
    }

    /// Keeps one charge inside the caller's transaction; nil when it no longer qualifies. Lock
    /// order as settlement and `capgate_refund`: the ledger row, the company counter, the user
    /// counter (an admission locks counters but no existing ledger row). An open hold (`hold_micros` set, `cost_source` NULL) becomes the cost
    /// (`cost_source` `hold`) and moves from `cost_held` to `cost_used` in both counters; the part
    /// a top-up grant held (SPEC §12, `cost_grant_part`; NULL: the whole) moves in the grant instead
    /// of the company counter.
    func keep(_ row: Row, on connection: PostgresConnection, olderThan: TimeInterval) async throws -> Acted? {
        let (from, to) = Self.month(of: row)
        let found = try await connection.query(
            """
            SELECT period_id, user_id, cost_grant_id, cost_grant_part FROM usage_ledger
             WHERE company_id = \(row.company) AND id = \(row.id) AND created_at BETWEEN \(from) AND \(to)
            """,
            logger: logger
        ).decode((Int64, UUID, Int64?, Int64?).self).collect()
        guard let (period, user, grant, grantPart) = found.first else { return nil }
        let open = try await connection.query(
            """
            SELECT CASE WHEN cost_source IS NULL THEN hold_micros END FROM usage_ledger
             WHERE company_id = \(row.company) AND id = \(row.id) AND created_at BETWEEN \(from) AND \(to)
               AND outcome = 'charged' AND settled_at IS NULL
               AND created_at <= clock_timestamp() - \(olderThan) * interval '1 second'
               FOR UPDATE
            """,
            logger: logger
        ).decode(Int64?.self).collect()
        guard let held = open.first else { return nil }
        try await connection.query(
            "SELECT 1 FROM company_usage WHERE company_id = \(row.company) AND period_id = \(period) FOR UPDATE", logger: logger)
        try await connection.query(
            """
            UPDATE usage_ledger SET settled_at = clock_timestamp(), cost_micros = COALESCE(\(held), cost_micros),
                   cost_source = CASE WHEN \(held)::bigint IS NULL THEN cost_source ELSE 'hold' END
             WHERE company_id = \(row.company) AND id = \(row.id) AND created_at BETWEEN \(from) AND \(to)
            """,
            logger: logger)
        if let held, held > 0 {
            // The part of a hold a top-up grant took (SPEC §12) is the grant's, not the company counter's.
            let granted = grant == nil ? 0 : (grantPart ?? held)
            if held > granted {
                try await connection.query(
                    """
                    UPDATE company_usage SET cost_held = cost_held - \(held - granted), cost_used = cost_used + \(held - granted)
                     WHERE company_id = \(row.company) AND period_id = \(period)
                    """,
                    logger: logger)
            }
            try await connection.query(
                """
                UPDATE user_usage SET cost_held = cost_held - \(held), cost_used = cost_used + \(held)
                 WHERE company_id = \(row.company) AND period_id = \(period) AND user_id = \(user)
                """,
                logger: logger)
            if let grant, granted > 0 {
                try await connection.query(
                    """
                    UPDATE topup_grants SET cost_held = cost_held - \(granted), cost_used = cost_used + \(granted)
                     WHERE company_id = \(row.company) AND id = \(grant)
                    """,
                    logger: logger)
            }
        }
        return (.kept, held.map(Micros.init))
    }

    /// Gives each charge back through `capgate_refund` if it is unsettled for `olderThan`
    /// seconds; `company` narrows the look-up to one company.
    public func refund(_ ids: [Int64], company: UUID? = nil, olderThan: TimeInterval = defaultGrace) async throws -> [Resolution] {
        try await resolve(ids, company: company, olderThan: olderThan, action: .refund) { connection, row in
            let (from, to) = Self.month(of: row)
            let rows = try await connection.query(
                """
                SELECT capgate_refund(l.company_id, l.id, NULL, NULL, l.created_at) FROM usage_ledger l
                 WHERE l.company_id = \(row.company) AND l.id = \(row.id) AND l.created_at BETWEEN \(from) AND \(to)
                   AND l.outcome = 'charged' AND l.settled_at IS NULL
                   AND l.created_at <= clock_timestamp() - \(olderThan) * interval '1 second'
                """,
                logger: logger
            ).decode(Bool.self).collect()
            guard let refunded = rows.first else { return nil }
            return (refunded ? .refunded : .skipped("a replayed attempt of this charge succeeded or is in flight: the charge stands"), nil)
        }
    }

    /// What an operator asked for.
    enum Action { case keep, refund }

    /// A second either side of the row's `created_at` as it was read: the ledger is partitioned
    /// by month of `created_at` (docs/ledger.md), so a look-up by id that also gives this range
    /// reads the row's month only (the id alone probes every month's index). A `Date` carries
    /// the microseconds of a `timestamptz` to within a microsecond, hence not `=`.
    static func month(of row: Row) -> (from: Date, to: Date) {
        (row.createdAt.addingTimeInterval(-1), row.createdAt.addingTimeInterval(1))
    }

    typealias Row = (id: Int64, company: UUID, outcome: String, settledAt: Date?, status: Int32?, createdAt: Date)

    /// What an action did with a row: its outcome, and for a kept charge the open hold it charged.
    typealias Acted = (outcome: Resolution.Outcome, charged: Micros?)

    /// Looks every id up at once (without `company`, one scan of the ledger: its key leads with
    /// the company), then acts on each in its own transaction. `act` returns nil when the row no
    /// longer qualifies; the row is then read again to say why.
    func resolve(
        _ ids: [Int64], company: UUID?, olderThan: TimeInterval, action: Action,
        act: @escaping @Sendable (PostgresConnection, Row) async throws -> Acted?
    ) async throws -> [Resolution] {
        var found: [Int64: Row] = [:]
        for row in try await rows(ids, company: company) { found[row.id] = row }
        var out: [Resolution] = []
        for id in ids {
            guard let row = found[id] else {
                out.append(Resolution(id: id, companyID: company, outcome: Self.noRow))
                continue
            }
            let acted = try await database.transaction { connection in try await act(connection, row) }
            if let acted {
                out.append(Resolution(id: id, companyID: row.company, outcome: acted.outcome, charged: acted.charged))
            } else {
                let now = try await rows([id], company: row.company).first
                out.append(Resolution(id: id, companyID: row.company, outcome: Self.why(now, action: action, olderThan: olderThan)))
            }
        }
        return out
    }

    func rows(_ ids: [Int64], company: UUID?) async throws -> [Row] {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT id, company_id, outcome, settled_at, upstream_status, created_at FROM usage_ledger
                 WHERE id = ANY(\(ids)) AND (\(company)::uuid IS NULL OR company_id = \(company))
                """,
                logger: logger
            )
            var out: [Row] = []
            for try await r in rows.decode((Int64, UUID, String, Date?, Int32?, Date).self) {
                out.append((r.0, r.1, r.2, r.3, r.4, r.5))
            }
            return out
        }
    }

    /// An id the ledger does not hold: never written, or in a month retention dropped (its calls
    /// were settled before the drop, so nothing is left to keep or refund).
    static let noRow = Resolution.Outcome.skipped("no ledger row with this id (none was written, or its month was dropped by retention)")

    /// Why a row was not acted on.
    static func why(_ row: Row?, action: Action, olderThan: TimeInterval) -> Resolution.Outcome {
        guard let row else { return noRow }
        if row.outcome == "refunded" {
            return action == .refund ? .already("refunded") : .skipped("refunded, not charged")
        }
        if row.settledAt != nil {
            if row.status == nil { return action == .keep ? .already("kept") : .skipped("kept by an operator already") }
            return .skipped("settled by the provider (status \(row.status.map(String.init) ?? "none"))")
        }
        return .skipped("pending: younger than \(Int(olderThan)) s (lower --older-than to act on it)")
    }
}
