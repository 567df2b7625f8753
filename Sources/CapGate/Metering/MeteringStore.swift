import Foundation
import Logging
import NIOCore
import PostgresNIO

/// The metering hot path in PostgreSQL: admit, refund and settle, plus the read-only usage
/// state. The SQL functions live in `db/functions/`, one file each: a single call is
/// `capgate_charge.sql` (behind `capgate_admit.sql`, and `capgate_admit_idempotent.sql` for a
/// call with an Idempotency-Key), a batch `capgate_admit_batch.sql`, a refund
/// `capgate_refund.sql`, token counts `capgate_settle_batch.sql`.
///
/// Admissions are batched (group commit): while one admission transaction is in flight, arriving
/// calls queue, and the next transaction admits all of them with one `capgate_admit_batch` call,
/// deciding each in arrival order against the locked counters. A caller is answered only after
/// the transaction holding its admission committed. Settlements (token counts) are queued the
/// same way without anyone waiting for them; ``flush()`` writes what is left at shutdown.
public struct MeteringStore: Sendable {
    let database: Database
    /// Admissions commit with `synchronous_commit = off` (database.durability = relaxed).
    let relaxed: Bool
    let admissions: BatchQueue<AdmissionItem, AdmissionRow>
    let settlements: BatchQueue<Settlement, Void>
    /// Concurrency slots of calls that ended (SPEC §14), freed by the next admission transaction.
    let slotEnds: SlotEnds
    /// Where a refund, give-back, settlement or kept answer waits while the database cannot take
    /// it (`spool.directory`); nil: retried in memory only (lost if the process ends).
    let spool: Spool?

    /// The most calls one admission transaction takes; more wait for the next one.
    public static let maxBatch = 256
    /// How long a settlement (token counts) arriving at an idle queue waits for others before
    /// they are written together, and the least time between the starts of two settlement
    /// transactions under load: one every 50 ms at most instead of one per call, or one as soon as
    /// the last ended. Its cost is mostly per transaction (planning, and under budgets or token
    /// windows the company counters it locks, which admissions wait for): paced, budgets on
    /// every call went from −13.5 % / −17.4 % requests/s at c=64 and +0.17 ms at c=1 to
    /// −7 % / −11 % and −0.04 ms (BENCHMARKS.md, session 26). Holds stay open up to this much
    /// longer, never less than what the calls cost. The charge itself is already committed; a
    /// crash can lose at most this much of token counts (the ledger rows then show `settled_at`
    /// NULL, and an open hold stands until `capgate unsettled` decides it).
    public static let settlementGather = Duration.milliseconds(50)

    /// How long noted slot ends gather before one `capgate_rate_end` transaction writes them
    /// (``SlotEnds``): at most 20 such transactions a second, off the admissions' path. Another
    /// gateway sees an end within this time; this gateway's own admissions and usage reads see it
    /// at once.
    public static let slotEndGather = Duration.milliseconds(50)

    /// - Parameters:
    ///   - admissionQueueLimit: `database.admissionQueueLimit` (see `MeteringStore+Overload.swift`).
    ///   - slotEndGather: how long a slot end waits for an admission to carry it (``SlotEnds``).
    public init(
        database: Database, relaxed: Bool = false, admissionQueueLimit: Int = Self.defaultAdmissionQueueLimit, spool: Spool? = nil,
        slotEndGather: Duration = Self.slotEndGather
    ) {
        self.database = database
        self.relaxed = relaxed
        self.spool = spool
        let slotEnds = SlotEnds(database: database, gather: slotEndGather)
        self.slotEnds = slotEnds
        self.admissions = Self.admissionQueue(
            database: database, relaxed: relaxed, queueLimit: admissionQueueLimit, spool: spool, slotEnds: slotEnds)
        self.settlements = BatchQueue(maxBatch: Self.maxBatch * 4, gather: Self.settlementGather, pace: Self.settlementGather) { items in
            await Self.settleBatch(items, database: database, spool: spool)
        }
    }

    /// Writes the slot ends noted so far (and waits for a write in flight), so that a read of the
    /// caller's calls in flight that follows counts none that ended on this gateway.
    func slotEndsWritten() async {
        await slotEnds.flush()
    }

    /// How admission batching went so far (batches, calls, largest batch).
    public var admissionStatistics: BatchQueue<AdmissionItem, AdmissionRow>.Statistics { admissions.statistics }

    /// How settlement batching went so far (batches, settlements, largest batch).
    var settlementStatistics: BatchQueue<Settlement, Void>.Statistics { settlements.statistics }

    /// Admits a call whose company and user come from a verified token: exact under any concurrency.
    public func admit(_ r: AdmissionRequest) async throws -> Admission {
        let row = try await admissionRow(AdmissionItem(keyHash: nil, request: r))
        guard let decision = row.decision else {
            throw DatabaseError.other("capgate_admit_batch returned no decision")
        }
        return complete(decision: decision, row: row)
    }

    /// Authenticates an API key (by its SHA-256) and admits for its user in the same transaction.
    /// Throws the 401 when the key is unknown, revoked or its user disabled.
    public func admit(key: String, _ r: AdmissionRequest) async throws -> (UserIdentity, Admission) {
        let row = try await admissionRow(AdmissionItem(keyHash: ApiKeyGenerator.hash(key), request: r))
        let caller = row.caller
        guard caller.auth == .ok, let company = caller.companyID, let user = caller.userID, let decision = row.decision else {
            throw Authenticator.keyError(caller.auth)
        }
        let identity = UserIdentity(companyID: company, userID: user, role: caller.role ?? .member, credential: .apiKey)
        return (identity, complete(decision: decision, row: row))
    }

    /// A call with an `Idempotency-Key` runs its own transaction (`capgate_admit_idempotent`:
    /// the key is claimed before any counter is locked); every other call joins the next batch.
    func admissionRow(_ item: AdmissionItem) async throws -> AdmissionRow {
        guard item.request.idempotencyKey != nil else { return try await admissions.submit(item) }
        // Its own transaction: slots of calls that ended before it are written first.
        await slotEnds.flush()
        let relaxed = self.relaxed
        let rows = try await Self.runAdmission(
            [item], AdmitIdempotentStatement(keyHash: item.keyHash, request: item.request, relaxed: relaxed), database: database,
            spool: spool)
        return rows[0]
    }

    /// Builds the admission result from its row (a refusal's upgrade offer included).
    func complete(decision: Admission.Decision, row: AdmissionRow) -> Admission {
        let period = row.period
        var state = UsageState(
            plan: period.plan.map { UsageState.PlanRef(id: $0, name: period.planName ?? $0) },
            periodStart: period.start, periodEnd: period.end,
            companyUsed: period.companyUsed ?? 0, companyLimit: period.companyCap, userUsed: period.userUsed ?? 0,
            userLimit: period.userCap
        )
        state.feature = row.feature
        state.cost = row.cost
        state.rate = row.rate
        state.upgrade = row.upgrade?.upgrade
        if decision == .featureNotInPlan || decision == .featureLimitExceeded {
            state.feature?.upgradeLimit = row.upgrade?.featureLimit
        }
        if decision == .noActivePlan {
            state.companyUsed = 0
            state.userUsed = 0
        }
        return Admission(
            decision: decision, ledgerID: row.ledgerID, periodID: period.periodID, state: state, budgetScope: row.budgetScope,
            answer: row.answer)
    }

    /// Reports that the attempt `requestID` at a charge failed (`capgate_refund`): the charge is
    /// given back unless another attempt at it (a retry with the same Idempotency-Key) is still
    /// in flight or succeeded. Returns true when it was given back now; false when it stands, or
    /// was already given back. Reporting the same attempt twice changes nothing.
    @discardableResult
    public func refund(companyID: UUID, ledgerID: Int64, requestID: String, upstreamStatus: Int?) async throws -> Bool {
        try await Self.refund(
            companyID: companyID, ledgerID: ledgerID, requestID: requestID, upstreamStatus: upstreamStatus, database: database)
    }

    static func refund(companyID: UUID, ledgerID: Int64, requestID: String, upstreamStatus: Int?, database: Database) async throws -> Bool {
        let status = upstreamStatus.map(Int32.init)
        return try await database.write { connection in
            let rows = try await connection.query(
                "SELECT capgate_refund(\(companyID), \(ledgerID), \(status), \(requestID))",
                logger: database.logger
            )
            for try await value in rows.decode(Bool.self) { return value }
            return false
        }
    }

    /// Records the upstream status and usage on a charge that stands and settles its cost (its
    /// hold traded for what the usage cost, or kept as its cost when the usage is not known).
    /// Queued, not awaited: the charge and its hold were committed by the admission, and an open
    /// hold is never less than the call may cost; settlements are written in batches
    /// (`capgate_settle_batch`) while the caller moves on.
    public func settle(companyID: UUID, ledgerID: Int64, upstreamStatus: Int, usage: ProviderUsage) {
        settle(Settlement(companyID: companyID, ledgerID: ledgerID, status: Int32(clamping: upstreamStatus), usage: usage))
    }

    func settle(_ settlement: Settlement) {
        settlements.enqueue(settlement)
    }

    /// Logs and counts the settled calls that cost more than their hold: the provider billed past
    /// the bound (more prompt overhead than `costs.promptOverheadTokens`, a price raised since).
    static func report(_ overHolds: [OverHold], logger: Logger) {
        for over in overHolds {
            GatewayMetrics.costOverHold()
            logger.warning(
                "a call cost more than its hold",
                metadata: [
                    "company_id": "\(over.companyID.uuidString.lowercased())", "ledger_id": "\(over.ledgerID)",
                    "hold_usd": "\(Micros(over.hold).decimal)", "cost_usd": "\(Micros(over.cost).decimal)",
                ])
        }
    }

    /// Returns once every settlement queued so far is written: a ledger read after it sees the
    /// provider status and token counts of every call this gateway answered before.
    public func settledSoFar() async {
        await settlements.processedSoFar()
    }

    /// Waits until every queued settlement and every noted slot end is written (graceful
    /// shutdown, tests): a gateway stopped right after an answer ended must not leave its slot
    /// taken until the lease.
    public func flush() async {
        await settlements.flush()
        await slotEnds.flush()
    }

    /// Writes `items` in one `capgate_settle_batch` transaction, acknowledged like every write
    /// (``Database/write(lateResult:failed:_:)``). The function commits with `synchronous_commit`
    /// off, so its acknowledgement does not wait for the standby: acting on it early is harmless,
    /// since a settlement lost with a primary leaves the call's hold open as its cost, never less
    /// than the call may cost (`capgate unsettled` decides it), and nothing is forwarded on it.
    static func settleBatch(_ items: [Settlement], database: Database, spool: Spool? = nil) async -> [Result<Void, any Error>] {
        do {
            let over = try await database.write(statement: SettleBatchStatement(items: items))
            report(over, logger: database.logger)
            return items.map { _ in .success(()) }
        } catch DatabaseError.unavailable where spool != nil {
            // The charges stand; their token counts wait in the spool until the database is back.
            let writes = PendingWrites(database: database, spool: spool)
            for item in items {
                let usage = item.usage
                writes.later(
                    .settle(
                        company: item.companyID, ledger: item.ledgerID, status: item.status, inputTokens: usage.inputTokens,
                        outputTokens: usage.outputTokens, cacheWrite5m: usage.cacheWrite5m, cacheWrite1h: usage.cacheWrite1h,
                        cacheRead: usage.cacheRead, known: usage.known))
            }
            return items.map { _ in .failure(DatabaseError.unavailable) }
        } catch {
            // The charges stand; only their token counts are missing (the ledger shows settled_at NULL).
            database.logger.error("could not record token counts", metadata: ["calls": "\(items.count)"])
            return items.map { _ in .failure(error) }
        }
    }

    /// The usage state of a company (and one of its users) at `at`, without changing anything.
    /// A company whose period has ended is moved into the next one first, as its next call
    /// would be (SPEC §6), so a usage read never shows a gap the next call would not see.
    public func state(companyID: UUID, userID: UUID?, at: Date = Date()) async throws -> UsageState {
        if let row = try await stateRow(companyID: companyID, userID: userID, at: at) {
            return try await state(row, userID: userID)
        }
        try await database.write { connection in
            _ = try await connection.query("SELECT capgate_roll_company(\(companyID), \(at))", logger: database.logger).collect()
        }
        guard let row = try await stateRow(companyID: companyID, userID: userID, at: at) else {
            var state = UsageState(
                plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: userID == nil ? nil : 0,
                userLimit: nil)
            state.upgrade = try await upgrade(from: nil)
            return state
        }
        return try await state(row, userID: userID)
    }

    typealias StateRow = (String, String, Date, Date, Int64, Int64?, Int64, Int64?)

    func state(_ row: StateRow, userID: UUID?) async throws -> UsageState {
        var state = UsageState(
            plan: .init(id: row.0, name: row.1), periodStart: row.2, periodEnd: row.3,
            companyUsed: row.4, companyLimit: row.5,
            userUsed: userID == nil ? nil : row.6, userLimit: row.7
        )
        state.upgrade = try await upgrade(from: row.0)
        return state
    }

    func stateRow(companyID: UUID, userID: UUID?, at: Date) async throws -> StateRow? {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT pp.plan_id, pl.name, pp.started_at, pp.ends_at,
                       COALESCE((SELECT used FROM company_usage cu WHERE cu.company_id = pp.company_id AND cu.period_id = pp.id), 0),
                       pl.monthly_company_cap,
                       COALESCE((SELECT used FROM user_usage uu WHERE uu.company_id = pp.company_id AND uu.period_id = pp.id
                                    AND uu.user_id = \(userID)), 0),
                       COALESCE((SELECT monthly_cap FROM users u WHERE u.company_id = pp.company_id AND u.id = \(userID)), pl.monthly_user_cap)
                  FROM plan_periods pp JOIN plans pl ON pl.id = pp.plan_id
                 WHERE pp.company_id = \(companyID) AND pp.started_at <= \(at) AND pp.ends_at > \(at)
                """,
                logger: database.logger
            )
            for try await row in rows.decode(StateRow.self) {
                return Optional(row)
            }
            return nil
        }
    }

    /// The plan a company on `planID` could move to from a cap (or from no plan): what a refusal
    /// would offer (`capgate_upgrade_offer`).
    public func upgrade(from planID: String?) async throws -> UsageState.Upgrade? {
        try await upgradeOffer(planID == nil ? .noActivePlan : .companyCap, plan: planID, feature: nil, refused: nil)?.upgrade
    }

    /// The upgrade offer of a refusal (`capgate_upgrade_offer`, the function the admission
    /// answers it with): `decision` says whether it is a cap's or a feature's.
    func upgradeOffer(
        _ decision: Admission.Decision, plan: String?, feature: String?, refused: FeatureState.Counter?
    ) async throws -> UpgradeOffer? {
        let window = refused?.kind.sql
        return try await database.run { client in
            let rows = try await client.query(
                """
                SELECT plan_id, company_cap, user_cap, feature_limit
                  FROM capgate_upgrade_offer(\(decision.rawValue), \(plan), \(feature), \(window), \(refused?.limit))
                """,
                logger: database.logger
            )
            for try await (id, company, user, limit) in rows.decode((String, Int64?, Int64?, Int64?).self) {
                return UpgradeOffer(upgrade: .init(plan: id, companyLimit: company, userLimit: user), featureLimit: limit)
            }
            return nil
        }
    }
}
