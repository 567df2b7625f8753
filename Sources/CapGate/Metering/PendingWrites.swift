import Foundation
import Logging
import NIOCore
import PostgresNIO
import ServiceLifecycle

/// Writes that must reach the database eventually (a refund, a give-back, token counts, a kept
/// answer) and that found it unavailable: put in the ``Spool`` before the caller is answered and
/// replayed by ``SpoolReplayer``; without a spool (or if the disk refuses), retried in memory.
struct PendingWrites: Sendable {
    let database: Database
    let spool: Spool?

    func later(_ write: PendingWrite) {
        if let spool {
            do {
                if case .giveBackWhenDue = write {
                    try spool.put(write, note: "an admission's give-back was spooled until its deadline has passed")
                } else {
                    try spool.put(write)
                }
                return
            } catch {
                database.logger.error("the spool could not be written; retrying in memory (lost if the gateway stops)")
            }
        }
        let database = self.database
        Task {
            do {
                if case .giveBackWhenDue(_, _, _, _, let due) = write {
                    try? await Task.sleep(for: .seconds(max(0, due.timeIntervalSinceNow)))
                }
                // A give-back whose search found transactions still open (a commit waiting for a
                // synchronous standby) is tried again, as long as one unavailable database is.
                var attempt = 1
                while true {
                    do {
                        try await database.untilAvailable { try await Self.apply(write, database: database) }
                        break
                    } catch is OpenWrites.Pending where attempt < Database.retryAttempts {
                        attempt += 1
                        try await Task.sleep(for: Database.retryInterval)
                    }
                }
            } catch {
                database.logger.error("a write the database could not take was given up", metadata: ["write": "\(write.kind)"])
            }
        }
    }

    /// Thrown by ``apply(_:database:)`` for a write whose time has not come (``PendingWrite/giveBackWhenDue(keyHashes:companies:requestIDs:since:due:)``).
    struct NotDue: Error {}

    /// Applies `write` once (each is idempotent); throws `DatabaseError.unavailable` while the
    /// database cannot take it, ``NotDue`` (touching nothing) before its time.
    static func apply(_ write: PendingWrite, database: Database, now: Date = Date()) async throws {
        switch write {
        case .giveBackWhenDue(let hashes, let companies, let requestIDs, let since, let due):
            guard now >= due else { throw NotDue() }
            try await apply(.giveBack(keyHashes: hashes, companies: companies, requestIDs: requestIDs, since: since), database: database)
        case .refund(let company, let ledger, let requestID, let status):
            if try await MeteringStore.refund(
                companyID: company, ledgerID: ledger, requestID: requestID, upstreamStatus: status, database: database)
            {
                GatewayMetrics.refund(reason: .spooled)
            }
        case .settle(let company, let ledger, let status, let input, let output, let write5m, let write1h, let read, let known):
            let usage = ProviderUsage(
                inputTokens: input, outputTokens: output, cacheWrite5m: write5m, cacheWrite1h: write1h, cacheRead: read,
                known: known ?? (input != nil && output != nil))
            let settlement = Settlement(companyID: company, ledgerID: ledger, status: status, usage: usage)
            let over = try await database.write(statement: SettleBatchStatement(items: [settlement]))
            MeteringStore.report(over, logger: database.logger)
        case .answer(let company, let user, let key, let requestID, let status, let contentType, let body):
            try await MeteringStore.keepAnswer(
                companyID: company, userID: user, key: key, requestID: requestID, status: status, contentType: contentType,
                body: body.map { ByteBuffer(bytes: $0) }, database: database)
        case .giveBack(let hashes, let companies, let requestIDs, let since):
            let charges = try await LateAdmissions.findCharges(
                keyHashes: hashes.map { ByteBuffer(bytes: $0) }, companies: companies, requestIDs: requestIDs, since: since,
                database: database)
            for charge in charges {
                if try await MeteringStore.refund(
                    companyID: charge.company, ledgerID: charge.ledger, requestID: charge.requestID, upstreamStatus: nil,
                    database: database)
                {
                    GatewayMetrics.refund(reason: .lateAdmission)
                }
            }
        }
    }
}

extension PendingWrite {
    /// For logs: what kind of write, never its content.
    var kind: String {
        switch self {
        case .refund: "refund"
        case .settle: "settle"
        case .answer: "answer"
        case .giveBack, .giveBackWhenDue: "give_back"
        }
    }
}

/// Replays the spool at start, every `interval` while running, and once more at shutdown (after
/// the server drained and the settlements were flushed, before the pool closes), until the
/// database takes each write.
struct SpoolReplayer: Service {
    let spool: Spool
    let database: Database
    let interval: Duration

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            await replay()
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: interval) }
        }
        await replay()
        if spool.depth > 0 {
            database.logger.warning(
                "writes still in the spool at shutdown; the next start replays them", metadata: ["spool_depth": "\(spool.depth)"])
        }
    }

    /// One pass over the spool, oldest first; stops at the first write the database cannot take.
    func replay() async {
        for (name, write) in spool.pending() {
            do {
                try await PendingWrites.apply(write, database: database)
                spool.remove(name)
            } catch DatabaseError.unavailable {
                return
            } catch is PendingWrites.NotDue, is OpenWrites.Pending {
                // Not yet: the next pass tries it again; the writes after it need not wait.
                continue
            } catch {
                database.logger.error(
                    "a spooled write failed; it stays in the spool", metadata: ["write": "\(write.kind)", "file": "\(name)"])
            }
        }
    }
}
