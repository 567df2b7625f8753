import CapGate
import Foundation
import Logging
import PostgresNIO

/// The demo's features, entitlements and routes (SPEC §8): the recommended route table for the
/// Anthropic API (models and count_tokens free, batches by item, messages by feature header) and
/// plans that sell `analysis`, `compatibility` and `chat` with day and period limits.
extension DemoSeed {
    static let features: [(id: String, name: String, sort: Int32)] = [
        ("analysis", "Analysis", 10), ("compatibility", "Compatibility", 20), ("chat", "Chat", 30),
    ]

    /// plan, feature, daily, period, user daily, user period (nil = unlimited).
    static let entitlements: [(plan: String, feature: String, daily: Int64?, period: Int64?, userDaily: Int64?, userPeriod: Int64?)] = [
        ("free", "analysis", 3, 20, nil, nil),
        ("low", "analysis", 10, nil, 5, nil), ("low", "chat", nil, nil, nil, nil),
        ("medium", "analysis", 50, nil, 20, nil), ("medium", "compatibility", 10, nil, nil, nil), ("medium", "chat", nil, nil, nil, nil),
        ("high", "analysis", nil, nil, nil, nil), ("high", "compatibility", nil, nil, nil, nil), ("high", "chat", nil, nil, nil, nil),
    ]

    /// id, method, path, units, items field, feature, feature header.
    static let routes: [(id: String, method: String, path: String, units: Int32, items: String?, feature: String?, header: Bool)] = [
        ("models", "GET", "/v1/models*", 0, nil, nil, false),
        ("count-tokens", "POST", "/v1/messages/count_tokens", 0, nil, nil, false),
        ("batches", "POST", "/v1/messages/batches", 1, "requests", "analysis", false),
        ("messages", "POST", "/v1/messages", 1, nil, "analysis", true),
    ]

    /// Adds what is missing (a demo database seeded before features existed gets them too).
    static func seedFeatures(_ connection: PostgresConnection, logger: Logger) async throws {
        for f in features {
            try await connection.query(
                "INSERT INTO features (id, name, sort_order) VALUES (\(f.id), \(f.name), \(f.sort)) ON CONFLICT DO NOTHING", logger: logger)
        }
        for e in entitlements {
            try await connection.query(
                """
                INSERT INTO plan_features (plan_id, feature_id, daily_limit, period_limit, user_daily_limit, user_period_limit)
                VALUES (\(e.plan), \(e.feature), \(e.daily), \(e.period), \(e.userDaily), \(e.userPeriod)) ON CONFLICT DO NOTHING
                """, logger: logger)
        }
        let existing = try await connection.query("SELECT count(*)::bigint FROM routes", logger: logger).decode(Int64.self).collect()
        guard existing.first == 0 else { return }  // the operator's table stays as they left it
        for r in routes {
            try await connection.query(
                """
                INSERT INTO routes (id, method, path, units, items_field, feature, feature_header)
                VALUES (\(r.id), \(r.method), \(r.path), \(r.units), \(r.items), \(r.feature), \(r.header)) ON CONFLICT DO NOTHING
                """, logger: logger)
        }
    }
}
