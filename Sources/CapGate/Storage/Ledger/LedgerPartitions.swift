import Foundation
import Logging
import PostgresNIO

/// The ledger's monthly partitions (`usage_ledger_pYYYYMM`, migration 0026; docs/ledger.md),
/// made ahead of the calls by `capgate_ledger_partitions_ahead`: at the gateway's start and every
/// hour (``job(interval:logger:)``), and by `capgate rollover`. A call never waits for one.
public struct LedgerPartitions: Sendable {
    /// How many months after the current one (UTC) exist while a gateway runs.
    public static let monthsAhead = 2

    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// Makes the partitions missing from the month containing `at` to `months` months after it;
    /// returns the names made, none when every month was there.
    @discardableResult
    public func makeAhead(months: Int = LedgerPartitions.monthsAhead, at: Date = Date()) async throws -> [String] {
        try await database.run { client in
            try await client.withConnection { connection in
                try await Self.makeAhead(on: connection, months: months, at: at, logger: logger)
            }
        }
    }

    /// ``makeAhead(months:at:)`` on a connection the caller holds (the rollover's).
    static func makeAhead(on connection: PostgresConnection, months: Int, at: Date, logger: Logger) async throws -> [String] {
        try await connection.query("SELECT capgate_ledger_partitions_ahead(\(Int32(months)), \(at))", logger: logger)
            .decode(String.self).collect()
    }

    /// The gateway's job: at once, then every `interval`; a failed round (a lock not had within a
    /// second, a standby) is logged and the next one tries again. With `retention` set
    /// (`ledger.retentionMonths`) each round then drops the months past it that may go
    /// (``LedgerRetention/enforce(retention:now:)``): a month dropped is logged at info, a month
    /// refused at warning with its reason, once a round, and the round goes on to the next month.
    func job(interval: Duration, retention: Int? = nil, logger: Logger) -> PeriodicJob {
        PeriodicJob(interval: interval) {
            do {
                let made = try await makeAhead()
                if !made.isEmpty {
                    logger.info("ledger partitions made", metadata: ["partitions": "\(made.joined(separator: ","))"])
                }
            } catch {
                logger.warning(
                    "ledger partitions not made; the next round tries again", metadata: ["error": "\(String(describing: error))"])
            }
            if let retention { await enforce(retention: retention, logger: logger) }
        }
    }

    /// One round of retention, logged. The drop reads a whole month: it runs with the export's
    /// time bound, not the gateway's `database.timeout`.
    func enforce(retention: Int, now: Date = Date(), logger: Logger) async {
        do {
            let outcomes = try await LedgerRetention(database: database.with(timeout: LedgerExport.timeout))
                .enforce(retention: retention, now: now)
            for outcome in outcomes {
                switch outcome {
                case .dropped(let dropped):
                    logger.info("ledger month dropped", metadata: ["month": "\(dropped.month)", "rows": "\(dropped.rows)"])
                case .refused(let month, let refusal):
                    logger.warning(
                        "ledger month past retention not dropped", metadata: ["month": "\(month)", "reason": "\(refusal)"])
                }
            }
        } catch {
            logger.warning("ledger retention failed; the next round tries again", metadata: ["error": "\(String(describing: error))"])
        }
    }
}
