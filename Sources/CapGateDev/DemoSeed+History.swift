import CapGate
import Foundation
import Logging
import PostgresNIO

extension DemoSeed {
    /// The demo company's other users (no keys): history is spread over them too.
    static let historyUsers = ["ana@demo.example", "ben@demo.example", "chen@demo.example"]

    /// A past period (last month) and every day of this period before today, with calls by five
    /// users on `analysis` and `chat`, admitted through `capgate_charge` at their time so the
    /// counters, feature windows and ledger agree (`capgate verify` holds). Few enough that no
    /// threshold is crossed: the console shows real-looking charts, and the first notifications
    /// the demo writes are the ones the printed example triggers today.
    static func seedHistory(
        _ connection: PostgresConnection, logger: Logger, company: UUID, users: [UUID], periodStart: Date, now: Date
    ) async throws {
        let calendar = PeriodMath.calendar
        let previous = calendar.date(byAdding: .month, value: -1, to: periodStart)!
        let today = calendar.startOfDay(for: now)
        // Calls per day, by the day's index: last month a little busier than this one.
        let pastPattern = [2, 3, 1, 2, 3, 1, 0]
        let currentPattern = [1, 2, 3, 2, 1, 0, 2]
        var calls: [(user: UUID, feature: String, at: Date)] = []
        var day = previous
        var index = 0
        while day < today {
            let pattern = day < periodStart ? pastPattern : currentPattern
            for k in 0..<pattern[index % pattern.count] {
                let user = users[(index + k * 2) % users.count]
                let at = day.addingTimeInterval(Double(9 * 3600 + k * 7200 + (index % 5) * 600))
                calls.append((user, k % 2 == 0 ? "analysis" : "chat", at))
            }
            day = calendar.date(byAdding: .day, value: 1, to: day)!
            index += 1
        }
        for (n, call) in calls.enumerated() {
            let rows = try await connection.query(
                """
                SELECT (capgate_charge(\(company), \(call.user), 1, 'POST', '/v1/messages', 'claude-sonnet-4-6', \(call.feature),
                                       \("demo-history-\(n)"), NULL, \(call.at))).decision
                """, logger: logger)
            for try await decision in rows.decode(String.self) where decision != "charged" {
                logger.warning("demo history call not admitted", metadata: ["decision": "\(decision)"])
            }
        }
        // Answered by the provider a moment later, with token counts, like a real call.
        try await connection.query(
            """
            UPDATE usage_ledger SET upstream_status = 200, settled_at = created_at + interval '2 seconds',
                   input_tokens = 200 + (id % 7) * 90, output_tokens = 120 + (id % 5) * 60
             WHERE company_id = \(company) AND request_id LIKE 'demo-history-%'
            """, logger: logger)
    }
}
