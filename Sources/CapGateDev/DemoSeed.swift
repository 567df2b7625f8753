import CapGate
import Foundation
import Logging
import PostgresNIO

/// The demo data `capgate dev` loads once: plans, features with their entitlements and the
/// route table (`DemoSeed+Features.swift`), the price book (`DemoSeed+Prices.swift`), a company on `low`, an admin and a member with API keys. Keys are shown once, so the dev folder keeps them in `demo.json`.
public struct DemoSeed: Sendable {
    public var companyID: UUID
    public var adminID: UUID
    public var memberID: UUID
    public var adminKey: String
    public var memberKey: String
    public var operatorToken: String

    /// Loads `demo.json` from `directory`, or seeds the database and writes it.
    public static func ensure(client: PostgresClient, directory: String, operatorToken: String?, logger: Logger) async throws -> DemoSeed {
        let path = directory + "/demo.json"
        if let data = FileManager.default.contents(atPath: path), let json = try? JSON.parse(Array(data)),
            let seed = DemoSeed(json: json), try await exists(client: client, company: seed.companyID, logger: logger)
        {
            var seed = seed
            if let operatorToken { seed.operatorToken = operatorToken }
            let database = Database(client: client, timeout: .seconds(60), logger: logger)
            try await database.transaction {
                try await seedFeatures($0, logger: logger)
                try await seedPrices($0, logger: logger)
            }
            return seed
        }
        let seed = try await seed(
            client: client, operatorToken: operatorToken ?? "op_" + ApiKeyGenerator.randomToken(bytes: 24), logger: logger)
        try seed.json.serialized().write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o600)
        return seed
    }

    static func exists(client: PostgresClient, company: UUID, logger: Logger) async throws -> Bool {
        try await !client.query("SELECT 1 FROM companies WHERE id = \(company)", logger: logger).collect().isEmpty
    }

    /// A demo plan: company / user caps (units) and cost budgets (SPEC §11, USD per period; nil:
    /// unlimited).
    typealias Plan = (
        id: String, name: String, company: Int64?, user: Int64?, price: Decimal, isDefault: Bool, sort: Int32,
        companyBudget: Micros?, userBudget: Micros?
    )

    /// The demo plans, as in the seed figures (company / user caps); budgets on `free` (small
    /// enough that a few long calls reach them) and `medium`. None on `low`, the demo company's
    /// plan: where a budget applies, an unpriced model or a call without `max_tokens` is 400 and
    /// the history seeded through `capgate_charge` (no bound) would be refused, so the demo
    /// company's calls stay as they were until the operator moves it or gives `low` a budget.
    static let plans: [Plan] = [
        ("free", "Free", 20, 5, 0, true, 0, dollars(5), dollars(1)),
        ("low", "Low Use", 100, 25, 49, false, 10, nil, nil),
        ("medium", "Medium Use", 500, 100, 199, false, 20, dollars(100), dollars(20)),
        ("high", "High Use", 2000, nil, 499, false, 30, nil, nil),
    ]

    /// Whole US dollars as micro-dollars.
    static func dollars(_ whole: Int64) -> Micros { Micros(whole * 1_000_000) }

    static func seed(client: PostgresClient, operatorToken: String, logger: Logger) async throws -> DemoSeed {
        let company = UUID()
        let admin = UUID()
        let member = UUID()
        let adminKey = ApiKeyGenerator.make()
        let memberKey = ApiKeyGenerator.make()
        let database = Database(client: client, timeout: .seconds(60), logger: logger)
        try await database.transaction { connection in
            try await seedCatalog(connection, logger: logger)
            try await seedFeatures(connection, logger: logger)
            try await seedPrices(connection, logger: logger)
            try await connection.query("INSERT INTO companies (id, name) VALUES (\(company), 'Demo Company')", logger: logger)
            try await connection.query(
                """
                INSERT INTO users (company_id, id, email, role) VALUES
                    (\(company), \(admin), 'admin@demo.example', 'admin'), (\(company), \(member), 'member@demo.example', 'member')
                """,
                logger: logger
            )
            var everyone = [admin, member]
            for email in historyUsers {
                let id = UUID()
                try await connection.query(
                    "INSERT INTO users (company_id, id, email, role) VALUES (\(company), \(id), \(email), 'member')", logger: logger)
                everyone.append(id)
            }
            for (user, key) in [(admin, adminKey), (member, memberKey)] {
                try await connection.query(
                    "INSERT INTO api_keys (company_id, id, user_id, prefix, key_hash) VALUES (\(company), \(UUID()), \(user), \(key.prefix), \(key.hash))",
                    logger: logger
                )
            }
            let now = Date()
            let start = PeriodMath.calendar.date(from: PeriodMath.calendar.dateComponents([.year, .month], from: now))!
            let previous = PeriodMath.calendar.date(byAdding: .month, value: -1, to: start)!
            try await PeriodStore.startPeriod(
                connection, logger: logger, company: company, plan: "low", start: previous, end: start, autoRenew: true,
                source: "demo")
            try await PeriodStore.startPeriod(
                connection, logger: logger, company: company, plan: "low", start: start, autoRenew: true, source: "demo")
            try await seedHistory(connection, logger: logger, company: company, users: everyone, periodStart: start, now: now)
        }
        return DemoSeed(
            companyID: company, adminID: admin, memberID: member, adminKey: adminKey.key, memberKey: memberKey.key,
            operatorToken: operatorToken
        )
    }

    /// The plans, the store's products and the top-up pack (kept if present).
    static func seedCatalog(_ connection: PostgresConnection, logger: Logger) async throws {
        for p in plans {
            try await connection.query(
                """
                INSERT INTO plans (id, name, monthly_company_cap, monthly_user_cap, price, is_default, sort_order,
                                   monthly_company_budget, monthly_user_budget)
                VALUES (\(p.id), \(p.name), \(p.company), \(p.user), \(p.price)::numeric, \(p.isDefault), \(p.sort),
                        \(p.companyBudget?.value), \(p.userBudget?.value))
                ON CONFLICT (id) DO NOTHING
                """,
                logger: logger
            )
        }
        for (product, plan, interval) in [
            ("skininsight.low.monthly", "low", "month"), ("skininsight.medium.monthly", "medium", "month"),
            ("skininsight.high.monthly", "high", "month"), ("skininsight.high.yearly", "high", "year"),
        ] {
            try await connection.query(
                "INSERT INTO products (product_id, plan_id, interval) VALUES (\(product), \(plan), \(interval)) ON CONFLICT DO NOTHING",
                logger: logger
            )
        }
        // A top-up pack (SPEC §12): 100 analyses and $5 of budget for a year.
        try await connection.query(
            """
            INSERT INTO products (product_id, kind, units, budget_micros, valid_days)
            VALUES ('skininsight.pack.100', 'topup', 100, 5000000, 365) ON CONFLICT DO NOTHING
            """,
            logger: logger)
    }

    var json: JSON {
        .obj([
            "company_id": JSON(companyID), "admin_id": JSON(adminID), "member_id": JSON(memberID),
            "admin_key": .string(adminKey), "member_key": .string(memberKey), "operator_token": .string(operatorToken),
        ])
    }

    init(companyID: UUID, adminID: UUID, memberID: UUID, adminKey: String, memberKey: String, operatorToken: String) {
        self.companyID = companyID
        self.adminID = adminID
        self.memberID = memberID
        self.adminKey = adminKey
        self.memberKey = memberKey
        self.operatorToken = operatorToken
    }

    init?(json: JSON) {
        guard let c = json["company_id"]?.stringValue.flatMap(UUID.init(uuidString:)),
            let a = json["admin_id"]?.stringValue.flatMap(UUID.init(uuidString:)),
            let m = json["member_id"]?.stringValue.flatMap(UUID.init(uuidString:)),
            let ak = json["admin_key"]?.stringValue, let mk = json["member_key"]?.stringValue,
            let op = json["operator_token"]?.stringValue
        else { return nil }
        self.init(companyID: c, adminID: a, memberID: m, adminKey: ak, memberKey: mk, operatorToken: op)
    }
}
