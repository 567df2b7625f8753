import Foundation
import Logging
import PostgresNIO

/// Gives back the charges of an admission transaction that ended after its callers had been
/// answered 503 at `database.timeout` (see ``Database/run(lateResult:_:)``). None of its calls
/// was forwarded, so none of them may stay charged:
///
/// - it committed late (PostgreSQL answered after the deadline): every call it charged is
///   refunded;
/// - it failed late (the connection broke): whether it committed first is unknown, so the ledger
///   is searched for its calls (request id and time) and what it charged is refunded.
///
/// The database may still be unreachable then: each step is retried every 2 seconds for up to
/// 10 minutes, after which the request ids are logged for the operator.
struct LateAdmissions: Sendable {
    let items: [AdmissionItem]
    let database: Database

    /// The `lateResult` of the admission call.
    @Sendable func settle(_ result: Result<[AdmissionRow], any Error>) {
        Task { await giveBack(result) }
    }

    func giveBack(_ result: Result<[AdmissionRow], any Error>) async {
        let charges: [(company: UUID, ledger: Int64)]
        switch result {
        case .success(let rows):
            charges = zip(items, rows).compactMap { item, row in
                guard row.decision == Admission.Decision.charged.rawValue, let ledger = row.ledgerID else { return nil }
                return (row.companyID ?? item.request.companyID, ledger)
            }
        case .failure:
            guard let found = await retrying("find the charges of an admission that failed late", { try await findCharges() }) else {
                return
            }
            charges = found
        }
        for charge in charges {
            let refunded = await retrying("refund an admission that committed late") {
                try await MeteringStore.refund(companyID: charge.company, ledgerID: charge.ledger, upstreamStatus: nil, database: database)
            }
            if refunded == true { GatewayMetrics.refund(reason: "late_admission") }
        }
        if !charges.isEmpty {
            database.logger.warning(
                "an admission committed after its callers were answered 503; its charges were given back",
                metadata: ["calls": "\(charges.count)"])
        }
    }

    /// The charged ledger rows of these calls, if the transaction committed: matched by request id
    /// and time (the ledger row's `created_at` is the call's time) within the calls' companies
    /// (a key's company, or a token's).
    func findCharges() async throws -> [(company: UUID, ledger: Int64)] {
        let hashes = items.compactMap(\.keyHash)
        let companies = items.compactMap { $0.keyHash == nil ? $0.request.companyID : nil }
        let requestIDs = items.map(\.request.requestID)
        let times = items.map(\.request.at)
        return try await database.run { client in
            let rows = try await client.query(
                """
                SELECT l.company_id, l.id FROM usage_ledger l
                 WHERE l.company_id IN (SELECT k.company_id FROM api_keys k WHERE k.key_hash = ANY(\(hashes))
                                        UNION SELECT unnest(\(companies)::uuid[]))
                   AND (l.request_id, l.created_at) IN (SELECT * FROM unnest(\(requestIDs)::text[], \(times)::timestamptz[]))
                   AND l.outcome = 'charged'
                """,
                logger: database.logger
            )
            var found: [(company: UUID, ledger: Int64)] = []
            for try await (company, ledger) in rows.decode((UUID, Int64).self) { found.append((company, ledger)) }
            return found
        }
    }

    /// `body`'s result, tried again while the database is unavailable; nil (and the calls
    /// logged) when it could not be done.
    func retrying<T: Sendable>(_ what: String, _ body: () async throws -> T) async -> T? {
        do {
            return try await database.untilAvailable(body)
        } catch {
            database.logger.error(
                "could not \(what); these calls may stay charged without having been forwarded",
                metadata: ["request_ids": "\(items.map(\.request.requestID).joined(separator: ","))"])
            return nil
        }
    }
}
