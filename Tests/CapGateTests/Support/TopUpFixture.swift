import CapGate
import Foundation

extension Harness {
    /// `POST /admin/v1/products` of a top-up pack; the answer must be 201.
    func createTopUp(_ id: String, units: Int64?, budget: String? = nil, days: Int64? = nil) async throws {
        var body: [JSON.Field] = [.init("product_id", .string(id)), .init("kind", "topup"), .init("units", JSON(units))]
        if let budget { body.append(.init("budget", .string(budget))) }
        if let days { body.append(.init("valid_days", .int(days))) }
        let reply = try await op(.POST, "/admin/v1/products", .object(body))
        precondition(reply.status == 201, "top-up create failed: \(reply.body)")
    }

    /// A store event posted by the operator (`POST /admin/v1/billing/events`).
    func storeEvent(
        _ type: String, company: UUID, product: String, transaction: String, original: String? = nil, purchase: Date? = nil,
        expiration: Date? = nil
    ) async throws -> Reply {
        var body: [JSON.Field] = [
            .init("type", .string(type)), .init("company_id", JSON(company)), .init("product_id", .string(product)),
            .init("transaction_id", .string(transaction)),
        ]
        if let original { body.append(.init("original_transaction_id", .string(original))) }
        if let purchase { body.append(.init("purchase_date", JSON(purchase))) }
        if let expiration { body.append(.init("expiration_date", JSON(expiration))) }
        return try await op(.POST, "/admin/v1/billing/events", .object(body))
    }

    /// Buys each pack for `company` (a purchase event a minute ago, expiring `days` from now); each
    /// answer must be 201.
    func buyGrants(_ company: UUID, _ packs: [(transaction: String, product: String, days: Double)]) async throws {
        let now = Date()
        for pack in packs {
            let reply = try await storeEvent(
                "purchase", company: company, product: pack.product, transaction: pack.transaction, purchase: now - 60,
                expiration: now + 86_400 * pack.days)
            precondition(reply.status == 201, "purchase failed: \(reply.body)")
        }
    }

    /// The statuses of `callers` concurrent callers making `each` calls one after another, caller
    /// `i` with `keys[i % keys.count]`.
    func concurrentStatuses(keys: [String], callers: Int = 64, each: Int = 2) async throws -> [Int] {
        try await withThrowingTaskGroup(of: [Int].self) { group in
            for i in 0..<callers {
                group.addTask {
                    var out: [Int] = []
                    for _ in 0..<each { out.append(try await self.message(key: keys[i % keys.count]).status) }
                    return out
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    /// A grant's counters by its transaction: units used, cost used, cost held (-1 when there is none).
    func grant(_ transaction: String) async throws -> (units: Int64, cost: Int64, held: Int64) {
        let condition = "FROM topup_grants WHERE transaction_id = '\(transaction)'"
        return (
            try await scalar("SELECT coalesce((SELECT units_used \(condition)), -1)"),
            try await scalar("SELECT coalesce((SELECT cost_used \(condition)), -1)"),
            try await scalar("SELECT coalesce((SELECT cost_held \(condition)), -1)")
        )
    }

    /// The ledger's charged rows of `company`, oldest first, as the transaction of the grant that
    /// paid each one's units ("plan" when none did).
    func unitPayers(_ company: UUID) async throws -> [String] {
        let text = try await self.text(
            """
            SELECT string_agg(coalesce(g.transaction_id, 'plan'), ',' ORDER BY l.id) FROM usage_ledger l
              LEFT JOIN topup_grants g ON g.company_id = l.company_id AND g.id = l.units_grant_id
             WHERE l.company_id = '\(company.text)' AND l.outcome = 'charged'
            """)
        return text.map { $0.split(separator: ",").map(String.init) } ?? []
    }
}
