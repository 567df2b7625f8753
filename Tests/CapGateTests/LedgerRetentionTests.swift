import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// Issue #50 item 2: retention drops a ledger month (its partition detached and dropped) only when
/// it is past `ledger.retentionMonths`, exported with the bytes its rows give now, and holds no
/// unsettled charge; `capgate verify` stays clean and still checks the periods it held.
///
/// The months are January and February 2025 (partitions made for them, as for any past month),
/// each call admitted by `capgate_charge` inside a company's monthly period, so every counter
/// agrees with the ledger before the drop.
@Suite("Ledger retention", .timeLimit(.minutes(5)))
struct LedgerRetentionTests {
    typealias P = LedgerPartitionTests
    static let logger = TestCluster.logger
    static let january = LedgerMonth("2025-01")!
    static let february = LedgerMonth("2025-02")!

    static func at(_ text: String) -> Date { Timestamp.parse(text)! }

    /// A company with one user, monthly periods from January to April 2025, and the partitions
    /// of January and February 2025.
    static func seed(_ client: PostgresClient) async throws -> (company: UUID, user: UUID) {
        let company = UUID()
        let user = UUID()
        try await P.seed(client, company: company, user: user, bounds: (0...3).map { P.month(january.start, plus: $0) })
        #expect(
            try await LedgerPartitions(database: P.database(client)).makeAhead(months: 1, at: january.start)
                == ["usage_ledger_p202501", "usage_ledger_p202502"])
        return (company, user)
    }

    /// One call charged at `at` and settled.
    @discardableResult
    static func settledCall(_ client: PostgresClient, _ ids: (company: UUID, user: UUID), at: String) async throws -> Int64 {
        let id = try await P.charge(client, ids.company, ids.user, request: "r-\(at)", at: Self.at(at))
        try await P.settle(client, ids.company, [id])
        return id
    }

    static func export(
        _ client: PostgresClient, _ month: LedgerMonth, to path: String, format: String = "jsonl"
    ) async throws
        -> LedgerExport.Summary
    {
        try await LedgerExport(database: P.database(client)).export(
            LedgerExport.Request(month: month.description, path: path, format: format))
    }

    static func retention(_ client: PostgresClient) -> LedgerRetention { LedgerRetention(database: P.database(client)) }

    /// What dropping `month` gave: the refusal, or nil when it was dropped.
    static func refusal(
        _ client: PostgresClient, _ month: LedgerMonth, retention: Int? = 1, now: Date = Date()
    ) async throws -> LedgerRetention.Refusal? {
        do {
            _ = try await Self.retention(client).drop(month, retention: retention, now: now)
            return nil
        } catch let refusal as LedgerRetention.Refusal {
            return refusal
        }
    }

    static func count(_ client: PostgresClient, _ sql: String) async throws -> Int64 {
        try #require(try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(Int64.self).collect().first)
    }

    static func verify(_ client: PostgresClient) async throws -> [BillingStore.Mismatch] {
        try await BillingStore(database: P.database(client)).verify()
    }

    static func withFolder(_ body: (String) async throws -> Void) async throws {
        let folder = NSTemporaryDirectory() + "ledger-retention-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try await body(folder)
    }

    @Test("a month's age and the retention: the current month is 0 and always kept with the N before it")
    func ages() {
        let now = Self.at("2026-03-15T12:00:00Z")
        #expect(LedgerRetention.age(of: LedgerMonth("2026-03")!, now: now) == 0)
        #expect(LedgerRetention.age(of: LedgerMonth("2025-12")!, now: now) == 3)
        #expect(LedgerRetention.age(of: LedgerMonth("2026-05")!, now: now) == -2)
        #expect(!LedgerRetention.isPast(LedgerMonth("2026-02")!, retention: 1, now: now))
        #expect(LedgerRetention.isPast(LedgerMonth("2026-01")!, retention: 1, now: now))
        #expect(!LedgerRetention.isPast(LedgerMonth("2026-01")!, retention: 2, now: now))
        #expect(!LedgerRetention.isPast(LedgerMonth("2026-03")!, retention: 0, now: now))
        #expect(LedgerRetention.month(ofPartition: "usage_ledger_p202501") == Self.january)
        #expect(LedgerRetention.month(ofPartition: "usage_ledger_default") == nil)
        #expect(LedgerRetention.partition(Self.january) == "usage_ledger_p202501")
    }

    @Test("refuses a month within the retention, or with ledger.retentionMonths unset, even exported and settled")
    func refusesWithinRetention() async throws {
        try await P.withDatabase { _, client in
            let ids = try await Self.seed(client)
            try await Self.settledCall(client, ids, at: "2025-02-10T10:00:00Z")
            try await Self.withFolder { folder in
                _ = try await Self.export(client, Self.february, to: folder + "/feb.jsonl")
                // On 2 March 2025 February is the month before the current one: kept with a retention of 1.
                let march = Self.at("2025-03-02T00:00:00Z")
                #expect(
                    try await Self.refusal(client, Self.february, retention: 1, now: march) == .withinRetention(Self.february, retention: 1)
                )
                #expect(try await Self.refusal(client, Self.february, retention: nil, now: march) == .retentionUnset)
                let current = LedgerMonth(containing: Date())
                #expect(try await Self.refusal(client, current, retention: 1) == .withinRetention(current, retention: 1))
                #expect(try await P.partitions(client).contains("usage_ledger_p202502"))
                // On 1 April it is past the retention, and goes.
                #expect(try await Self.refusal(client, Self.february, retention: 1, now: Self.at("2025-04-01T00:00:00Z")) == nil)
                #expect(!(try await P.partitions(client)).contains("usage_ledger_p202502"))
            }
        }
    }

    @Test("refuses a month not exported, then one holding an unsettled charge; nothing changes; settled and exported again, it goes")
    func refusesUnexportedAndUnsettled() async throws {
        try await P.withDatabase { _, client in
            let ids = try await Self.seed(client)
            try await Self.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            let open = try await P.charge(client, ids.company, ids.user, request: "open", at: Self.at("2025-01-20T10:00:00Z"))
            #expect(try await Self.refusal(client, Self.january) == .notExported(Self.january))
            try await Self.withFolder { folder in
                _ = try await Self.export(client, Self.january, to: folder + "/jan.jsonl")
                #expect(try await Self.refusal(client, Self.january) == .unsettled(Self.january, charges: 1))
                #expect(try await P.partitions(client).contains("usage_ledger_p202501"))
                #expect(try await Self.count(client, "SELECT count(*) FROM usage_ledger_p202501") == 2)
                #expect(try await Self.count(client, "SELECT count(*) FROM ledger_dropped_totals") == 0)
                #expect(try await Self.count(client, "SELECT count(*) FROM ledger_dropped_months") == 0)
                // Settled, the month differs from its export: refused as stale until exported again.
                try await P.settle(client, ids.company, [open])
                guard case .exportStale = try await Self.refusal(client, Self.january) else {
                    Issue.record("a settlement after the export must make it stale")
                    return
                }
                _ = try await Self.export(client, Self.january, to: folder + "/jan-2.jsonl")
                #expect(try await Self.refusal(client, Self.january) == nil)
            }
        }
    }

    @Test("refuses a stale export: a row added to the month after it was exported (its count and checksum named)")
    func refusesStaleExport() async throws {
        try await P.withDatabase { _, client in
            let ids = try await Self.seed(client)
            try await Self.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            try await Self.withFolder { folder in
                let exported = try await Self.export(client, Self.january, to: folder + "/jan.csv", format: "csv")
                #expect(exported.rows == 1)
                // A late row of January (settled, refunded: no counter moves), written after the export.
                _ = try await client.query(
                    """
                    INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, request_id, outcome, created_at,
                                              settled_at)
                    SELECT company_id, period_id, user_id, 1, 'POST', '/v1/messages', 'late', 'refunded', created_at,
                           created_at FROM usage_ledger WHERE company_id = \(ids.company)
                    """, logger: Self.logger
                ).collect()
                let refusal = try await Self.refusal(client, Self.january)
                guard case .exportStale(let month, let was, let now) = refusal else {
                    Issue.record("expected a stale export, got \(String(describing: refusal))")
                    return
                }
                #expect(month == Self.january && was == ["csv: 1 rows, sha256 \(exported.sha256)"])
                #expect(now.count == 1 && now[0].hasPrefix("csv: 2 rows, sha256 ") && !now[0].hasSuffix(exported.sha256))
                #expect(refusal?.description.contains("export it again") == true)
                #expect(try await P.partitions(client).contains("usage_ledger_p202501"))
            }
        }
    }

    @Test("a past month without a partition: refused, with its rows in the default partition named, until its partition is made")
    func refusesDefaultPartitionRows() async throws {
        try await P.withDatabase { _, client in
            let june = LedgerMonth("2024-06")!
            #expect(try await Self.refusal(client, june) == .notHeld(june))
            // A row of a month that has no partition lands in the default partition.
            let id = try await P.insert(client, at: Self.at("2024-06-15T12:00:00Z"))
            #expect(try await P.placed(client, id: id) == ["usage_ledger_default"])
            #expect(try await Self.refusal(client, june) == .inDefaultPartition(june, rows: 1))
            #expect(try await P.placed(client, id: id) == ["usage_ledger_default"])
            // Made as the refusal says, the month holds the row and is then checked like any other.
            _ = try await LedgerPartitions(database: P.database(client)).makeAhead(months: 0, at: june.start)
            #expect(try await P.placed(client, id: id) == ["usage_ledger_p202406"])
            #expect(try await Self.refusal(client, june) == .notExported(june))
        }
    }

    @Test("drops an exported settled month: its partition gone, the other month intact, verify clean and still checking its period")
    func dropsAndVerifies() async throws {
        try await P.withDatabase { _, client in
            let ids = try await Self.seed(client)
            let first = try await Self.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            try await Self.settledCall(client, ids, at: "2025-01-31T23:59:59.999Z")
            let kept = try await Self.settledCall(client, ids, at: "2025-02-01T00:00:00Z")
            #expect(try await Self.verify(client).isEmpty)
            try await Self.withFolder { folder in
                let exported = try await Self.export(client, Self.january, to: folder + "/jan.jsonl")
                let dropped = try await Self.retention(client).drop(Self.january, retention: 1)
                #expect(
                    dropped == .init(month: Self.january, rows: 2, format: "jsonl", sha256: exported.sha256, path: folder + "/jan.jsonl"))
                let partitions = try await P.partitions(client)
                #expect(!partitions.contains("usage_ledger_p202501") && partitions.contains("usage_ledger_p202502"))
                #expect(try await Self.count(client, "SELECT count(*) FROM pg_class WHERE relname = 'usage_ledger_p202501'") == 0)
                #expect(try await P.placed(client, ids.company) == ["usage_ledger_p202502"])
                #expect(try await Self.count(client, "SELECT id FROM usage_ledger WHERE company_id = '\(ids.company)'") == kept)
                #expect(try await Self.count(client, "SELECT calls FROM ledger_dropped_totals WHERE company_id = '\(ids.company)'") == 2)

                // Verify is clean: the January counters still count the dropped calls, and so do the totals.
                #expect(try await Self.verify(client).isEmpty)
                // ...and still checks January's period: a counter moved by hand is a mismatch.
                let period = try await Self.count(
                    client, "SELECT id FROM plan_periods WHERE company_id = '\(ids.company)' AND started_at = '2025-01-01Z'")
                _ = try await client.query(
                    "UPDATE company_usage SET used = used + 1 WHERE company_id = \(ids.company) AND period_id = \(period)",
                    logger: Self.logger
                ).collect()
                let mismatches = try await Self.verify(client)
                #expect(mismatches.map(\.periodID) == [period] && mismatches.map(\.counter) == [3], "\(mismatches)")
                _ = try await client.query(
                    "UPDATE company_usage SET used = used - 1 WHERE company_id = \(ids.company) AND period_id = \(period)",
                    logger: Self.logger
                ).collect()

                // A refund of a dropped call finds nothing and says so (false), no error; nothing moves.
                let refunded = try await client.query(
                    "SELECT capgate_refund(\(ids.company), \(first), NULL)", logger: Self.logger
                ).decode(Bool.self).collect()
                #expect(refunded == [false])
                #expect(try await Self.verify(client).isEmpty)
                // The period the dropped calls counted in cannot be deleted.
                do {
                    _ = try await client.query("DELETE FROM plan_periods WHERE id = \(period)", logger: Self.logger).collect()
                    Issue.record("the period of dropped calls was deleted")
                } catch {
                    #expect(String(reflecting: error).contains("has usage in the ledger"), "\(String(reflecting: error))")
                }
                // Dropped once: a second drop and a new export of the month are refused.
                guard case .alreadyDropped = try await Self.refusal(client, Self.january) else {
                    Issue.record("a second drop must be refused")
                    return
                }
                await #expect(throws: LedgerExport.Refusal.monthDropped(Self.january, export: folder + "/jan.jsonl")) {
                    try await Self.export(client, Self.january, to: folder + "/again.jsonl")
                }
            }
        }
    }

    @Test("the export of a month twice gives the same bytes, in both formats, and the drop recomputes the same checksum")
    func exportTwiceSameBytes() async throws {
        try await P.withDatabase { _, client in
            let ids = try await Self.seed(client)
            try await Self.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            try await Self.settledCall(client, ids, at: "2025-01-11T10:00:00.5Z")
            try await Self.withFolder { folder in
                for format in ["jsonl", "csv"] {
                    let one = try await Self.export(client, Self.january, to: folder + "/one.\(format)", format: format)
                    let two = try await Self.export(client, Self.january, to: folder + "/two.\(format)", format: format)
                    let bytes = try Data(contentsOf: URL(fileURLWithPath: folder + "/one.\(format)"))
                    #expect(bytes == (try Data(contentsOf: URL(fileURLWithPath: folder + "/two.\(format)"))))
                    #expect(one.sha256 == two.sha256 && one.rows == 2 && Int64(bytes.count) == one.bytes)
                }
                // What the drop hashes of the rows is what the export wrote (csv is checked first).
                let csv = try await Self.export(client, Self.january, to: folder + "/three.csv", format: "csv")
                let dropped = try await Self.retention(client).drop(Self.january, retention: 1)
                #expect(dropped.format == "csv" && dropped.sha256 == csv.sha256)
            }
        }
    }

    @Test("the hourly job and capgate rollover drop each month past the retention that may go, and warn once about each other")
    func automaticDrop() async throws {
        try await P.withDatabase { url, client in
            let ids = try await Self.seed(client)
            try await Self.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            try await Self.settledCall(client, ids, at: "2025-02-10T10:00:00Z")
            try await Self.withFolder { folder in
                _ = try await Self.export(client, Self.january, to: folder + "/jan.jsonl")
                // The job's round: January goes, February (not exported) stays with one warning.
                let log = LogCapture()
                let partitions = LedgerPartitions(database: Database(client: client, timeout: .seconds(60), logger: log.logger()))
                await partitions.enforce(retention: 1, logger: log.logger())
                #expect(log.matching("ledger month dropped").count == 1 && log.matching("month=2025-01").count == 1, "\(log.all)")
                let warned = log.matching("ledger month past retention not dropped")
                #expect(warned.count == 1 && warned[0].hasPrefix("warning") && warned[0].contains("month=2025-02"), "\(log.all)")
                #expect(warned.first?.contains("is not exported") == true)
                var held = try await P.partitions(client)
                #expect(!held.contains("usage_ledger_p202501") && held.contains("usage_ledger_p202502"))
                // Months within the retention are not even tried.
                #expect(log.all.filter { $0.contains("month=") }.count == 2, "\(log.all)")

                // capgate rollover: not in a dry run; then February, exported, goes.
                _ = try await Self.export(client, Self.february, to: folder + "/feb.jsonl")
                let dry = try await CapGateRunner.rollover(url: url, at: Date(), dryRun: true, retention: 1, logger: Self.logger)
                #expect(dry.retention.isEmpty)
                #expect(try await P.partitions(client).contains("usage_ledger_p202502"))
                let run = try await CapGateRunner.rollover(url: url, at: Date(), dryRun: false, retention: 1, logger: Self.logger)
                let dropped = run.retention.compactMap { outcome -> LedgerMonth? in
                    guard case .dropped(let month) = outcome else { return nil }
                    return month.month
                }
                #expect(dropped == [Self.february], "\(run)")
                #expect(run.description.contains(", dropped ledger month 2025-02 (1 rows)"), "\(run)")
                held = try await P.partitions(client)
                #expect(!held.contains("usage_ledger_p202502") && held.contains(P.partition(Date())))
                #expect(try await Self.verify(client).isEmpty)
            }
        }
    }
}
