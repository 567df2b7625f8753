import Foundation
import Logging
import NIOCore
import PostgresNIO

/// Gives back the charges of an admission transaction whose callers were answered 503 although
/// it may have committed. None of its calls was forwarded, so none of them may stay charged:
///
/// - it committed after its callers were answered at `database.timeout` (see
///   ``Database/run(lateResult:_:)``): every call it charged is refunded;
/// - its connection broke after the statement was sent (the server went away, the connection
///   was reset), or the call was cancelled at the deadline while its rows were arriving: whether
///   it committed is unknown, so the ledger is searched for its calls (request id, time,
///   company) and what it charged is refunded. The
///   search waits until `database.timeout` has passed since the statement was sent: the gateway's
///   connections carry it as `statement_timeout`, so by then the statement has ended or is
///   committing. A commit that waits for a synchronous standby is not bounded by
///   `statement_timeout` and stays invisible until the standby confirms, so the search first
///   waits for every write transaction open at that moment to end (``OpenWrites``).
///
/// A call of such an admission with an `Idempotency-Key` had its key marked failed by the same
/// refund (`capgate_refund`), so a retry is a new attempt.
struct LateAdmissions: Sendable {
    /// A charge one of these calls made, and that call's request id.
    typealias Charge = (company: UUID, ledger: Int64, requestID: String)

    let items: [AdmissionItem]
    let database: Database
    /// Where a give-back waits while the database cannot take it.
    var spool: Spool? = nil
    let sent = ContinuousClock.now

    /// The admission's `lateResult`: only a commit matters; an error after the deadline either
    /// rolled the transaction back (the server answered it) or was already reported through
    /// ``interrupted(by:)``.
    @Sendable func committedLate(_ result: Result<[AdmissionRow], any Error>) {
        guard case .success(let rows) = result else { return }
        let charges = zip(items, rows).compactMap { item, row -> Charge? in
            guard row.decision?.admitted == true, let ledger = row.ledgerID else {
                return nil
            }
            return (row.caller.companyID ?? item.request.companyID, ledger, item.request.requestID)
        }
        guard !charges.isEmpty else { return }
        database.logger.warning(
            "an admission committed after its callers were answered 503; giving its charges back",
            metadata: ["request_ids": "\(requestIDs)"])
        Task { await giveBack(charges) }
    }

    /// Called with the admission statement's error: when the statement may have run (the
    /// connection broke, the call was cancelled, or its rows came and its commit was not
    /// acknowledged), the ledger is searched for its charges.
    @Sendable func interrupted(by error: any Error) {
        guard Self.outcomeUnknown(error) else { return }
        database.logger.warning(
            "an admission ended without a known outcome (connection broken, or abandoned at database.timeout); looking for its charges to give them back",
            metadata: ["request_ids": "\(requestIDs)"])
        guard spool != nil else {
            Task { await lookForCharges() }
            return
        }
        // In the spool at once, done by its replayer once due: a gateway that stops during the
        // wait (a restart, a crash) leaves the give-back to its next start instead of losing it.
        PendingWrites(database: database, spool: spool).later(giveBackWhenDue())
    }

    /// The spooled give-back of these calls, due when their admission's deadline has passed.
    func giveBackWhenDue(now: ContinuousClock.Instant = .now, date: Date = Date()) -> PendingWrite {
        let wait = (sent + database.timeout + .seconds(1)) - now
        let (seconds, attoseconds) = wait.components
        return .giveBackWhenDue(
            keyHashes: items.compactMap { $0.keyHash.map { Data($0.readableBytesView) } },
            companies: items.compactMap { $0.keyHash == nil ? $0.request.companyID : nil },
            requestIDs: items.map(\.request.requestID), since: items.map(\.request.at).min() ?? date,
            due: date.addingTimeInterval(max(0, Double(seconds) + Double(attoseconds) / 1e18)))
    }

    /// Waits past the admission's deadline, then gives back what the ledger holds of its charges.
    private func lookForCharges() async {
        try? await Task.sleep(until: sent + database.timeout + .seconds(1))
        do {
            await giveBack(try await findCharges())
        } catch DatabaseError.unavailable, is OpenWrites.Pending {
            PendingWrites(database: database, spool: spool).later(
                .giveBack(
                    keyHashes: items.compactMap { $0.keyHash.map { Data($0.readableBytesView) } },
                    companies: items.compactMap { $0.keyHash == nil ? $0.request.companyID : nil },
                    requestIDs: items.map(\.request.requestID), since: items.map(\.request.at).min() ?? Date()))
        } catch {
            database.logger.error(
                "could not look up the charges of an interrupted admission; these calls may stay charged without having been forwarded",
                metadata: ["request_ids": "\(requestIDs)"])
        }
    }

    /// True for a failure that leaves the outcome unknown: the connection closed or broke with no
    /// answer from the server, or the call was cancelled at the deadline (PostgresNIO may then
    /// stop reading the rows of a statement that ran and committed; a lease that was still
    /// waiting sent nothing, and the search finds nothing). An error the server sent rolled the
    /// transaction back; a lease that failed (the database down) sent nothing.
    static func outcomeUnknown(_ error: any Error) -> Bool {
        if error is CancellationError || error is CommitUnacknowledged || error is DeadlineExceeded { return true }
        guard let psql = error as? PSQLError, psql.serverInfo == nil else { return false }
        switch psql.code {
        case .serverClosedConnection, .connectionError, .uncleanShutdown, .queryCancelled: return true
        default: return false
        }
    }

    var requestIDs: String { items.map(\.request.requestID).joined(separator: ",") }

    func giveBack(_ charges: [Charge]) async {
        var refunded = 0
        for charge in charges {
            do {
                let done = try await MeteringStore.refund(
                    companyID: charge.company, ledgerID: charge.ledger, requestID: charge.requestID, upstreamStatus: nil,
                    database: database)
                if done {
                    refunded += 1
                    GatewayMetrics.refund(reason: .lateAdmission)
                }
            } catch DatabaseError.unavailable {
                PendingWrites(database: database, spool: spool).later(
                    .refund(company: charge.company, ledger: charge.ledger, requestID: charge.requestID, status: nil))
            } catch {
                database.logger.error(
                    "could not give back a charge of an admission answered 503; the call may stay charged without having been forwarded",
                    metadata: ["request_id": "\(charge.requestID)"])
            }
        }
        if refunded > 0 {
            database.logger.warning(
                "charges of calls answered 503 were given back", metadata: ["calls": "\(refunded)", "request_ids": "\(requestIDs)"])
        }
    }

    /// The charges these calls made, if the transaction committed: ledger rows with the calls'
    /// request ids within their companies (a key's company, or a token's), from the earliest
    /// call's time on (a ledger row's `created_at` is its call's time).
    func findCharges() async throws -> [Charge] {
        try await Self.findCharges(
            keyHashes: items.compactMap(\.keyHash), companies: items.compactMap { $0.keyHash == nil ? $0.request.companyID : nil },
            requestIDs: items.map(\.request.requestID), since: items.map(\.request.at).min() ?? Date(), database: database)
    }

    static func findCharges(
        keyHashes hashes: [ByteBuffer], companies: [UUID], requestIDs ids: [String], since: Date, database: Database
    ) async throws -> [Charge] {
        try await OpenWrites.awaitEnd(database: database)
        return try await database.run { client in
            let rows = try await client.query(
                """
                WITH c AS (SELECT k.company_id FROM api_keys k WHERE k.key_hash = ANY(\(hashes))
                           UNION SELECT unnest(\(companies)))
                SELECT l.company_id, l.id, l.request_id FROM usage_ledger l
                 WHERE l.company_id IN (SELECT company_id FROM c)
                   AND l.created_at >= \(since) AND l.request_id = ANY(\(ids)) AND l.outcome = 'charged'
                """,
                logger: database.logger
            )
            var found: [Charge] = []
            for try await (company, ledger, requestID) in rows.decode((UUID, Int64, String).self) {
                found.append((company, ledger, requestID))
            }
            return found
        }
    }
}
