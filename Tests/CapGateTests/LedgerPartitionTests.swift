import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// Issue #50 item 1: `usage_ledger` partitioned by UTC month (migration 0026), its months made
/// ahead by `capgate_ledger_partitions_ahead` (the migration, `capgate rollover`, the gateway's
/// job), the paths that find a row by its id working across months, and a database of 0025
/// converted in place.
@Suite("Ledger partitions", .timeLimit(.minutes(5)))
struct LedgerPartitionTests {
    static let logger = TestCluster.logger

    static var utc: Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }

    /// The first instant (UTC) of the month `months` after the one containing `date`.
    static func month(_ date: Date = Date(), plus months: Int = 0) -> Date {
        let first = utc.date(from: utc.dateComponents([.year, .month], from: date))!
        return utc.date(byAdding: .month, value: months, to: first)!
    }

    /// The partition of the month containing `date`.
    static func partition(_ date: Date) -> String {
        let parts = utc.dateComponents([.year, .month], from: date)
        return "usage_ledger_p" + String(format: "%04d%02d", parts.year!, parts.month!)
    }

    static func exec(_ client: PostgresClient, _ query: PostgresQuery) async throws {
        _ = try await client.query(query, logger: logger).collect()
    }

    static func strings(_ client: PostgresClient, _ query: PostgresQuery) async throws -> [String] {
        try await client.query(query, logger: logger).decode(String.self).collect()
    }

    static func database(_ client: PostgresClient) -> Database {
        Database(client: client, timeout: .seconds(60), logger: logger)
    }

    /// The partitions of usage_ledger, by name.
    static func partitions(_ client: PostgresClient) async throws -> [String] {
        try await strings(
            client,
            """
            SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'usage_ledger'::regclass ORDER BY 1
            """)
    }

    /// Where each of a company's ledger rows is, in id order: its partition.
    static func placed(_ client: PostgresClient, _ company: UUID) async throws -> [String] {
        try await strings(client, "SELECT tableoid::regclass::text FROM usage_ledger WHERE company_id = \(company) ORDER BY id")
    }

    /// The partition holding the ledger row `id`.
    static func placed(_ client: PostgresClient, id: Int64) async throws -> [String] {
        try await strings(client, "SELECT tableoid::regclass::text FROM usage_ledger WHERE id = \(id)")
    }

    /// A row written straight into the ledger at `at` (no period, no counter): its id.
    static func insert(_ client: PostgresClient, at: Date) async throws -> Int64 {
        try #require(
            try await client.query(
                """
                INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, request_id, outcome, created_at)
                VALUES (gen_random_uuid(), 1, gen_random_uuid(), 1, 'POST', '/v1/messages', 'raw', 'charged', \(at))
                RETURNING id
                """, logger: logger
            ).decode(Int64.self).collect().first)
    }

    /// A fresh migrated database (a copy of the tests' template) and a client on it.
    static func withDatabase(_ body: @escaping @Sendable (DatabaseURL, PostgresClient) async throws -> Void) async throws {
        let url = try await TestCluster.freshDatabase()
        try await CapGateRunner.withClient(url: url, logger: logger) { try await body(url, $0) }
    }

    /// A plan without caps, the price of `claude-test` (so a call holds a cost and its settlement
    /// trades it), a company with one user, and its monthly periods `[bounds[i], bounds[i + 1])`.
    static func seed(_ client: PostgresClient, company: UUID, user: UUID, bounds: [Date]) async throws {
        try await exec(client, "INSERT INTO plans (id, name) VALUES ('p', 'P') ON CONFLICT DO NOTHING")
        try await exec(client, PostgresQuery(unsafeSQL: CostBudgetTests.priceRow + " ON CONFLICT DO NOTHING"))
        try await exec(client, "INSERT INTO companies (id, name) VALUES (\(company), 'C')")
        try await exec(client, "INSERT INTO users (company_id, id) VALUES (\(company), \(user))")
        for (start, end) in zip(bounds, bounds.dropFirst()) {
            try await exec(
                client,
                """
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                VALUES (\(company), 'p', \(start), \(end), \(bounds[0]))
                """)
        }
    }

    /// One call admitted by `capgate_charge` at `at` (a microsecond before it with `justBefore`):
    /// a 2,000-token prompt and max_tokens 100 of claude-test, so it holds a cost. Its ledger id.
    static func charge(
        _ client: PostgresClient, _ company: UUID, _ user: UUID, request: String, at: Date, justBefore: Bool = false
    ) async throws -> Int64 {
        let rows = try await client.query(
            """
            SELECT a.decision, a.ledger_id
              FROM capgate_charge(\(company), \(user), 1, 'POST', '/v1/messages', 'claude-test', NULL, \(request), NULL,
                                  \(at)::timestamptz - CASE WHEN \(justBefore) THEN interval '1 microsecond' ELSE interval '0' END,
                                  NULL::text[], 2000, 100, 0::smallint, NULL) a
            """, logger: logger
        ).decode((String, Int64?).self).collect()
        #expect(rows.first?.0 == "charged", "\(request): \(rows)")
        return try #require(rows.first?.1)
    }

    /// Settles the calls `ids` of `company` in one batch: status 200, 500 input and 20 output tokens.
    static func settle(_ client: PostgresClient, _ company: UUID, _ ids: [Int64]) async throws {
        let companies = ids.map { _ in company }
        let count = Int32(ids.count)
        try await exec(
            client,
            """
            SELECT count(*) FROM capgate_settle_batch(
                \(companies)::uuid[], \(ids)::bigint[], array_fill(200, ARRAY[\(count)]), array_fill(500::bigint, ARRAY[\(count)]),
                array_fill(20::bigint, ARRAY[\(count)]), array_fill(0::bigint, ARRAY[\(count)]), array_fill(0::bigint, ARRAY[\(count)]),
                array_fill(0::bigint, ARRAY[\(count)]), array_fill(true, ARRAY[\(count)]), array_fill(-3::bigint, ARRAY[\(count)]))
            """)
    }

    @Test("after migrate the ledger is partitioned by month: the current month, the two after it, a default partition, keys on each")
    func madeByMigrate() async throws {
        try await Self.withDatabase { _, client in
            #expect(try await Self.strings(client, "SELECT relkind::text FROM pg_class WHERE oid = 'usage_ledger'::regclass") == ["p"])
            let names = Set(try await Self.partitions(client))
            let ahead = (0...2).map { Self.partition(Self.month(plus: $0)) }
            #expect(Set(ahead).isSubset(of: names) && names.contains("usage_ledger_default"), "\(names.sorted())")
            // Each partition has the primary key (company_id, id, created_at): a look-up by id is an index scan in each.
            let keyless = try await Self.strings(
                client,
                """
                SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'usage_ledger'::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisprimary)
                """)
            #expect(keyless.isEmpty, "partitions without a primary key: \(keyless)")
            #expect(
                try await Self.strings(client, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'usage_ledger_pkey'")
                    == ["PRIMARY KEY (company_id, id, created_at)"])
            // Nothing left to make for a gateway starting now.
            #expect(try await LedgerPartitions(database: Self.database(client)).makeAhead() == [])
        }
    }

    @Test("the job makes each missing month once, ahead of a given time, moving that month's rows out of the default partition")
    func madeAhead() async throws {
        try await Self.withDatabase { _, client in
            let later = Self.month(plus: 6)
            let far = later.addingTimeInterval(10 * 86400)
            // A row of a month without a partition (a clock far ahead) lands in the default partition.
            let id = try await Self.insert(client, at: far)
            #expect(try await Self.placed(client, id: id) == ["usage_ledger_default"])

            let partitions = LedgerPartitions(database: Self.database(client))
            let expected = (0...2).map { Self.partition(Self.month(later, plus: $0)) }
            #expect(try await partitions.makeAhead(months: 2, at: later) == expected)
            #expect(try await partitions.makeAhead(months: 2, at: later) == [])
            #expect(try await partitions.makeAhead(months: 0, at: far) == [])
            // The row moved to its month, id and time unchanged; the default partition is empty.
            #expect(try await Self.placed(client, id: id) == [expected[0]])
            #expect(try await Self.strings(client, "SELECT (created_at = \(far))::text FROM usage_ledger WHERE id = \(id)") == ["true"])
            #expect(try await Self.strings(client, "SELECT count(*)::text FROM usage_ledger_default") == ["0"])
            // The months in between were not asked for.
            #expect(!(try await Self.partitions(client)).contains(Self.partition(Self.month(plus: 4))))
            // A new row of that month goes to it directly.
            #expect(try await Self.placed(client, id: try await Self.insert(client, at: later)) == [expected[0]])
        }
    }

    @Test("capgate rollover and capgate_rollover() make a missing month ahead (not in a dry run)")
    func madeByRollover() async throws {
        try await Self.withDatabase { url, client in
            let second = Self.partition(Self.month(plus: 2))
            try await Self.exec(client, PostgresQuery(unsafeSQL: "DROP TABLE \(second)"))
            let dry = try await CapGateRunner.rollover(url: url, at: Date(), dryRun: true, logger: Self.logger)
            #expect(dry.partitionsMade == [])
            #expect(!(try await Self.partitions(client)).contains(second))
            let run = try await CapGateRunner.rollover(url: url, at: Date(), dryRun: false, logger: Self.logger)
            #expect(run.partitionsMade == [second])
            #expect(run.description.hasSuffix(", made ledger partitions \(second)"), "\(run)")
            #expect(try await Self.partitions(client).contains(second))
            #expect(try await CapGateRunner.rollover(url: url, at: Date(), dryRun: false, logger: Self.logger).partitionsMade == [])
            // The SQL entry point (pg_cron's) makes it too.
            try await Self.exec(client, PostgresQuery(unsafeSQL: "DROP TABLE \(second)"))
            try await Self.exec(client, "SELECT * FROM capgate_rollover()")
            #expect(try await Self.partitions(client).contains(second))
        }
    }

    @Test("a gateway makes the next two months at its start when they are missing")
    func madeByTheGateway() async throws {
        let url = try await TestCluster.freshDatabase()
        let missing = [Self.partition(Self.month(plus: 1)), Self.partition(Self.month(plus: 2))]
        try await CapGateRunner.withClient(url: url, logger: Self.logger) { client in
            try await Self.exec(client, PostgresQuery(unsafeSQL: "DROP TABLE \(missing[0]), \(missing[1])"))
        }
        try await Harness.with(database: url) { h in
            let sql = "SELECT count(*) FROM pg_class WHERE relname IN ('\(missing[0])', '\(missing[1])') AND relispartition"
            let made = try await h.eventually(sql, equals: 2)
            #expect(made == 2, "the partitions \(missing) were not made by the gateway")
        }
    }

    @Test("calls a microsecond before and at the first instant of a month land in their months; one batch settles both")
    func monthBoundary() async throws {
        try await Self.withDatabase { url, client in
            let (company, user) = (UUID(), UUID())
            let boundary = Self.month(plus: 1)
            try await Self.seed(client, company: company, user: user, bounds: [Self.month(), boundary, Self.month(plus: 2)])
            let before = try await Self.charge(client, company, user, request: "before", at: boundary, justBefore: true)
            let at = try await Self.charge(client, company, user, request: "at", at: boundary)
            #expect(try await Self.placed(client, company) == [Self.partition(Self.month()), Self.partition(boundary)])
            #expect(
                try await Self.strings(
                    client, "SELECT (created_at < \(boundary))::text FROM usage_ledger WHERE company_id = \(company) ORDER BY id")
                    == ["true", "false"])
            try await Self.settle(client, company, [before, at])
            #expect(
                try await Self.strings(
                    client,
                    """
                    SELECT upstream_status || ' ' || cost_source || ' ' || (settled_at IS NOT NULL) FROM usage_ledger
                     WHERE company_id = \(company) ORDER BY id
                    """) == ["200 usage true", "200 usage true"])
            // Each period counted its call.
            #expect(
                try await Self.strings(client, "SELECT used::text FROM company_usage WHERE company_id = \(company) ORDER BY period_id")
                    == ["1", "1"])
            #expect(try await CapGateRunner.verify(url: url, logger: Self.logger).isEmpty)
        }
    }

    @Test("settlement, refunds, give-backs by `capgate unsettled` of calls whose rows are in the previous month's partition")
    func previousMonth() async throws {
        try await Self.withDatabase { url, client in
            let (company, user) = (UUID(), UUID())
            let previous = Self.month(plus: -1)
            #expect(
                try await Self.strings(client, "SELECT capgate_ledger_partitions_ahead(0, \(previous))") == [Self.partition(previous)])
            try await Self.seed(client, company: company, user: user, bounds: [previous, Self.month(), Self.month(plus: 1)])
            let at = Self.month().addingTimeInterval(-3600)
            var ids: [Int64] = []
            for request in ["settled", "refunded", "refunded-at", "wrong-time", "unsettled-refund", "unsettled-keep"] {
                ids.append(try await Self.charge(client, company, user, request: request, at: at))
            }
            #expect(try await Self.placed(client, company) == Array(repeating: Self.partition(previous), count: 6))

            try await Self.settle(client, company, [ids[0]])
            #expect(try await Self.strings(client, "SELECT capgate_refund(\(company), \(ids[1]), 500)::text") == ["true"])
            #expect(
                try await Self.strings(
                    client, "SELECT capgate_refund(\(company), \(ids[2]), 502, NULL, \(at)::timestamptz + interval '0.4 seconds')::text")
                    == ["true"])
            // The row's time narrows the look-up: a time a month off does not find the row.
            #expect(
                try await Self.strings(
                    client, "SELECT capgate_refund(\(company), \(ids[3]), 502, NULL, \(at)::timestamptz - interval '40 days')::text")
                    == ["false"])
            let unsettled = UnsettledCharges(database: Self.database(client))
            let refunded = try await unsettled.refund([ids[4]], company: company, olderThan: 0)
            #expect(refunded.map(\.description) == ["refunded \(ids[4]) (company \(company.text)): the units are given back"])
            let kept = try await unsettled.keep([ids[5]], olderThan: 0)
            let keptLine = "kept \(ids[5]) (company \(company.text)): the charge stands, its hold of "
            #expect(kept.count == 1 && kept[0].description.hasPrefix(keptLine), "\(kept)")

            #expect(
                try await Self.strings(
                    client,
                    """
                    SELECT outcome || ' ' || coalesce(upstream_status::text, '-') || ' ' || coalesce(cost_source, '-')
                      FROM usage_ledger WHERE company_id = \(company) ORDER BY id
                    """)
                    == ["charged 200 usage", "refunded 500 -", "refunded 502 -", "charged - -", "refunded - -", "charged - hold"])
            // The previous month's period: three calls stand.
            #expect(
                try await Self.strings(
                    client, "SELECT used::text FROM company_usage WHERE company_id = \(company) ORDER BY period_id") == ["3"])
            #expect(try await Self.placed(client, company) == Array(repeating: Self.partition(previous), count: 6))
            #expect(try await CapGateRunner.verify(url: url, logger: Self.logger).isEmpty)
        }
    }

    @Test("a database of migration 0025 with ledger rows in two months is converted in place: rows, ids, counters, verify clean")
    func upgradeFrom0025() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("lp_" + UUID().uuidString.prefix(8).lowercased()) }
        try await CapGateRunner.withClient(url: url, logger: Self.logger) { client in
            // The migrations as they were before the baseline, with today's functions.
            let old = try await OldMigrations.withFunctions().through("0025").migrate(client: client, logger: Self.logger)
            #expect(old.contains("0025_ledger_exports") && !old.contains { $0.hasPrefix("0026") }, "\(old)")
            #expect(try await Self.strings(client, "SELECT relkind::text FROM pg_class WHERE oid = 'usage_ledger'::regclass") == ["r"])

            let (company, user) = (UUID(), UUID())
            let previous = Self.month(plus: -1)
            try await Self.seed(client, company: company, user: user, bounds: [previous, Self.month(), Self.month(plus: 1)])
            var ids: [Int64] = []
            for (n, at) in [previous.addingTimeInterval(3600), Self.month().addingTimeInterval(-1), Self.month(), Date()].enumerated() {
                ids.append(try await Self.charge(client, company, user, request: "call-\(n)", at: at))
            }
            try await Self.settle(client, company, [ids[0], ids[2]])
            #expect(try await Self.strings(client, "SELECT capgate_refund(\(company), \(ids[1]), 500)::text") == ["true"])
            // This binary's verify reads 0027's view of the ledger (retention's totals), so it runs after
            // the conversion; the snapshot shows the conversion changed nothing it reads.

            let snapshot: @Sendable () async throws -> [String] = {
                try await Self.strings(client, "SELECT l::text FROM usage_ledger l ORDER BY id")
                    + Self.strings(client, "SELECT c::text FROM company_usage c ORDER BY period_id")
                    + Self.strings(client, "SELECT u::text FROM user_usage u ORDER BY period_id")
                    + Self.strings(client, "SELECT last_value || ' ' || is_called FROM usage_ledger_id_seq")
            }
            let before = try await snapshot()

            #expect(
                try await OldMigrations.withFunctions().migrate(client: client, logger: Self.logger) == [
                    "0026_ledger_partitions", "0027_ledger_retention", "0028_ledger_rollups",
                    "0029_rollup_unsettled",
                ])
            // Then this build: the baseline recorded, nothing run.
            #expect(try await Migrator().migrate(client: client, logger: Self.logger) == [Migrator.Baseline.recorded])
            #expect(try await Self.strings(client, "SELECT relkind::text FROM pg_class WHERE oid = 'usage_ledger'::regclass") == ["p"])
            #expect(try await snapshot() == before)
            #expect(
                try await Self.placed(client, company)
                    == [Self.partition(previous), Self.partition(previous), Self.partition(Self.month()), Self.partition(Self.month())])
            #expect(try await CapGateRunner.verify(url: url, logger: Self.logger).isEmpty)
            #expect(
                try await Self.strings(client, "SELECT indexname::text FROM pg_indexes WHERE tablename = 'usage_ledger' ORDER BY 1")
                    == ["usage_ledger_feature", "usage_ledger_idempotency", "usage_ledger_pkey", "usage_ledger_time"])
            #expect(try await Self.strings(client, "SELECT count(*)::text FROM pg_class WHERE relname LIKE 'usage_ledger_0025%'") == ["0"])

            // The sequence goes on: the next call has the next id, in this month's partition.
            let next = try await Self.charge(client, company, user, request: "after", at: Date())
            #expect(next == ids.max()! + 1)
            #expect(try await Self.placed(client, company).last == Self.partition(Date()))
            #expect(try await LedgerPartitions(database: Self.database(client)).makeAhead() == [])
            #expect(try await CapGateRunner.verify(url: url, logger: Self.logger).isEmpty)
        }
    }
}
