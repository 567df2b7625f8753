import CapGate
import Foundation
import Testing

/// The admission, settlement and refund functions read and write counters and windows by key, and
/// a connection keeps the plans it made the first time. On a fresh database those tables are empty
/// when the first calls are planned; a plan that scans them sequentially then would read every row
/// of them for every call once they have grown (found in session 22: the window update of the
/// batch read all 11,000 window rows for each batch). They must stay key lookups.
@Suite("Plans made on an empty database stay key lookups", .timeLimit(.minutes(3)))
struct PlanStabilityTests {
    /// The tables that grow with the companies and users (one row per owner or period); the
    /// ledger is read by the test itself, `rate_calls` holds only calls in flight (its lease
    /// purge scans it).
    static let tables = ["rate_windows", "company_usage", "user_usage"]

    /// Sequential and index scans of `tables` so far, and the rows index scans fetched from them,
    /// as the statistics system has them.
    static func scans(_ h: Harness) async throws -> (sequential: Int64, index: Int64, fetched: Int64) {
        let list = tables.map { "'\($0)'" }.joined(separator: ", ")
        let sequential = try await h.scalar(
            "SELECT sum(seq_scan) FROM pg_stat_user_tables WHERE relname IN (\(list))")
        let index = try await h.scalar(
            "SELECT sum(coalesce(idx_scan, 0)) FROM pg_stat_user_tables WHERE relname IN (\(list))")
        let fetched = try await h.scalar(
            "SELECT sum(coalesce(idx_tup_fetch, 0)) FROM pg_stat_user_tables WHERE relname IN (\(list))")
        return (sequential, index, fetched)
    }

    /// A round of calls over both admission paths: one at a time (the single call's function),
    /// then many at once (the batch), half of them failed by the provider (the refund).
    static func calls(_ h: Harness, keys: [String]) async throws {
        for key in keys.prefix(4) { #expect(try await h.message(key: key).status == 200) }
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for (index, key) in keys.enumerated() {
                group.addTask {
                    let failed: [(String, String)] = index % 2 == 0 ? [("x-mock-status", "500")] : []
                    return try await h.message(key: key, stream: index % 3 == 0, headers: failed).status
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses.allSatisfy { $0 == 200 || $0 == 500 }, "\(statuses)")
        // Settled (the settlement is queued after the answer): the round's writes are all done.
        let open = "SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND settled_at IS NULL"
        #expect(try await h.eventually(open, equals: 0) == 0)
    }

    @Test("after the tables grow, calls planned while they were empty scan none of them sequentially")
    func noSequentialScans() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(
                h, plan: "p", .obj(["company_rpm": 100_000, "user_rpm": 100_000, "user_tpm": 100_000_000, "user_concurrency": 1_000]))
            var keys: [String] = []
            for _ in 0..<4 { keys += try await h.createCompany(plan: "p", users: 8).users.map(\.key) }
            // Empty and analyzed empty: the state in which the planner prefers a scan to an index.
            try await h.exec("VACUUM ANALYZE " + Self.tables.joined(separator: ", "))
            try await Self.calls(h, keys: keys)

            // The tables grow (other companies' periods, counters with their windows, and feature
            // windows) and are analyzed again.
            try await h.exec(
                """
                INSERT INTO companies (id, name) SELECT md5('grow' || i)::uuid, 'grown ' || i FROM generate_series(1, 2000) i;
                INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                SELECT md5('grow' || i)::uuid, 'p', now() - interval '1 day', now() + interval '20 days', now() - interval '1 day'
                  FROM generate_series(1, 2000) i;
                INSERT INTO company_usage (company_id, period_id, used, rate_minute, rate_calls, rate_tokens)
                SELECT pp.company_id, pp.id, 1, date_trunc('minute', now()), 1, 1
                  FROM plan_periods pp JOIN companies c ON c.id = pp.company_id WHERE c.name LIKE 'grown %';
                INSERT INTO user_usage (company_id, period_id, user_id, used, rate_minute, rate_calls, rate_tokens)
                SELECT pp.company_id, pp.id, md5(pp.company_id::text || j)::uuid, 1, date_trunc('minute', now()), 1, 1
                  FROM plan_periods pp JOIN companies c ON c.id = pp.company_id, generate_series(0, 9) j
                 WHERE c.name LIKE 'grown %';
                INSERT INTO rate_windows (company_id, user_id, feature_id, minute, calls, tokens)
                SELECT md5('grow' || i)::uuid, md5('grow' || i || 'u' || j)::uuid, 'f', now(), 1, 1
                  FROM generate_series(1, 2000) i, generate_series(0, 9) j;
                ANALYZE rate_windows, company_usage, user_usage, plan_periods
                """)
            let before = try await Self.scans(h)
            try await Self.calls(h, keys: keys)
            // Wait for the gateway's connections to report this round: a backend flushes its counts
            // once idle, within 10 s (PostgreSQL's idle interval for statistics); the first flush is
            // seen as more index scans. The sequential count must not have moved.
            let flushed = "SELECT (sum(coalesce(idx_scan, 0)) > \(before.index))::int FROM pg_stat_user_tables"
            #expect(try await h.eventually(flushed, equals: 1, within: .seconds(30)) == 1)
            try await Task.sleep(for: .seconds(11))
            let after = try await Self.scans(h)
            #expect(after.sequential == before.sequential, "sequential scans: \(before.sequential) -> \(after.sequential)")
            // Nor a whole index (a scan disabled can still be a full index scan): the round's 36
            // calls read a few counter and window rows each, not the 2,000 grown companies'.
            #expect(after.fetched - before.fetched < 36 * 20, "rows fetched by index: \(after.fetched - before.fetched)")
        }
    }

    @Test("every function that disables sequential scans also disables JIT (a disabled scan costs past jit_above_cost)")
    func noJIT() async throws {
        try await Harness.with { h in
            let keyed = "SELECT count(*) FROM pg_proc WHERE proname LIKE 'capgate%' AND 'enable_seqscan=off' = ANY (proconfig)"
            let count = try await h.scalar(keyed)
            #expect(count >= 10)
            let compiled = keyed + " AND NOT ('jit=off' = ANY (proconfig))"
            #expect(try await h.scalar(compiled) == 0)
            // The batch and the single call are among them.
            let hot =
                keyed
                + " AND proname IN ('capgate_admit_batch', 'capgate_charge', 'capgate_settle_batch', 'capgate_settle_counters', 'capgate_rate_end')"
            #expect(try await h.scalar(hot) == 5)
        }
    }
}
