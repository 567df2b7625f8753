import Foundation
import Testing

/// One lock order for every path that moves a counter: an existing ledger row before any counter,
/// then the company counters (a batch's in key order), then the user counters (admission: company,
/// then user, and no existing ledger row; refund and settlement: ledger rows, company, user). Settlements of overlapping batches (a spool replay
/// settles a call again), refunds of calls in those batches and new admissions of the same users,
/// all at once: none may deadlock, and every counter must end equal to what the ledger says it
/// holds and used.
@Suite("Settlement and refund lock order", .timeLimit(.minutes(3)))
struct SettlementLockTests {
    @Test("settlements, refunds and admissions of one company's users at once: no deadlock, the counters equal the ledger")
    func noDeadlock() async throws {
        try await Harness.with { h in
            try await h.createBudgetPlan(
                "p", company: 1_000_000, user: 1_000_000, companyBudget: 1_000_000_000, userBudget: 1_000_000_000)
            let (company, users) = try await h.createCompany(plan: "p", users: 4)
            let c = company.text
            for i in 0..<60 {
                #expect(try await h.text(Self.admit(c, users[i % users.count].id, "pre\(i)")) == "charged")
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<2 {
                    group.addTask {
                        for _ in 0..<40 { try await h.exec(Self.settle(c)) }
                    }
                }
                group.addTask {
                    for _ in 0..<40 {
                        try await h.exec(
                            """
                            SELECT capgate_refund('\(c)', (SELECT id FROM usage_ledger WHERE company_id = '\(c)'
                                                             AND outcome = 'charged' ORDER BY random() LIMIT 1), 500)
                            """)
                    }
                }
                group.addTask {
                    for i in 0..<60 {
                        let decision = try await h.text(Self.admit(c, users[i % users.count].id, "new\(i)"))
                        #expect(decision == "charged")
                    }
                }
                try await group.waitForAll()
            }
            let ledger = "FROM usage_ledger WHERE company_id = '\(c)' AND outcome = 'charged'"
            #expect(try await h.scalar("SELECT count(*) \(ledger) AND cost_source IS NOT NULL") > 0, "nothing was settled")
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") > 0, "nothing was refunded")
            let held = try await h.scalar("SELECT coalesce(sum(hold_micros), 0) \(ledger) AND cost_source IS NULL")
            let used = try await h.scalar("SELECT coalesce(sum(cost_micros), 0) \(ledger) AND cost_source IS NOT NULL")
            #expect(try await h.scalar("SELECT cost_held FROM company_usage WHERE company_id = '\(c)'") == held)
            #expect(try await h.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(c)'") == used)
            // Each user's counter against its own calls.
            let mismatched = try await h.scalar(
                """
                SELECT count(*) FROM user_usage uu
                  LEFT JOIN (SELECT l.period_id, l.user_id,
                                    sum(l.hold_micros) FILTER (WHERE l.cost_source IS NULL) AS held,
                                    sum(l.cost_micros) FILTER (WHERE l.cost_source IS NOT NULL) AS used
                               FROM usage_ledger l WHERE l.company_id = '\(c)' AND l.outcome = 'charged'
                              GROUP BY l.period_id, l.user_id) s ON s.period_id = uu.period_id AND s.user_id = uu.user_id
                 WHERE uu.company_id = '\(c)'
                   AND (uu.cost_held <> coalesce(s.held, 0) OR uu.cost_used <> coalesce(s.used, 0))
                """)
            #expect(mismatched == 0)
        }
    }

    /// One call of 2,000 prompt tokens and max_tokens 100, admitted alone.
    static func admit(_ company: String, _ user: UUID, _ request: String) -> String {
        """
        SELECT (capgate_charge('\(company)', '\(user.text)', 1, 'POST', '/v1/messages', 'claude-test', NULL, '\(request)',
                               NULL, now(), NULL::text[], 2000, 100, 0::smallint, NULL)).decision
        """
    }

    /// A settlement of 20 of the company's charged calls at random (settled ones included), with
    /// 500 input and 20 output tokens each.
    static func settle(_ company: String) -> String {
        """
        WITH b AS MATERIALIZED (SELECT company_id, id FROM usage_ledger
                                 WHERE company_id = '\(company)' AND outcome = 'charged' ORDER BY random() LIMIT 20)
        SELECT count(*) FROM capgate_settle_batch(
            (SELECT array_agg(company_id ORDER BY id) FROM b), (SELECT array_agg(id ORDER BY id) FROM b),
            (SELECT array_agg(200 ORDER BY id) FROM b), (SELECT array_agg(500::bigint ORDER BY id) FROM b),
            (SELECT array_agg(20::bigint ORDER BY id) FROM b), (SELECT array_agg(0::bigint ORDER BY id) FROM b),
            (SELECT array_agg(0::bigint ORDER BY id) FROM b), (SELECT array_agg(0::bigint ORDER BY id) FROM b),
            (SELECT array_agg(true ORDER BY id) FROM b), (SELECT array_agg(-3::bigint ORDER BY id) FROM b))
        """
    }
}
