import Foundation
import PostgresNIO
import Testing

@testable import CapGate

/// The schema stays distributable by company (docs/scale-out.md): every table is classified as
/// Citus would hold it, every tenant table carries `company_id` in a key, and what Citus would
/// still refuse is listed here with its reason, so that a new table or key is a decision.
@Suite("Distributable schema", .timeLimit(.minutes(5)))
struct DistributableSchemaTests {
    /// Distributed by `company_id`, co-located with `companies` (distributed by its `id`).
    static let distributed: Set<String> = [
        "companies", "users", "api_keys", "plan_periods", "company_usage", "user_usage", "usage_ledger", "usage_ledger_attempts",
        "idempotency_keys", "company_feature_usage", "user_feature_usage", "notifications", "rate_windows", "rate_calls",
        "topup_grants", "ledger_dropped_totals", "usage_rollups", "usage_rollup_changes",
    ]

    /// Distributed tables with no key at all, on purpose: Citus distributes a table by a column
    /// without any unique key.
    static let distributedWithoutKey: [String: String] = [
        "usage_rollup_changes":
            "append-only: what each ledger statement changed, moved into usage_rollups by the compaction; an index would cost every admission batch an index insert"
    ]

    /// Reference tables (a copy on every worker): no company, small, read by every admission.
    static let reference: [String: String] = [
        "plans": "the plan catalogue: caps and budgets every admission reads",
        "products": "store products mapped to plans and top-up packs",
        "features": "the feature catalogue",
        "plan_features": "entitlements: plan × feature limits read by every admission",
        "routes": "what a call costs and which feature it uses, by method and path",
        "prices": "the price book (per model, from a time), read by the cost hold",
        "config_versions": "one row (route table version, thresholds, slot lease) read by every admission",
    ]

    /// Left on the coordinator (Citus local tables): global, or keyed by something other than the
    /// company, so they have no key with `company_id`.
    static let coordinator: [String: String] = [
        "capgate_migrations": "the migrator's record of applied files",
        "capgate_functions": "the checksums of the SQL functions applied",
        "billing_events": "store events keyed by transaction id; company_id is NULL until a delivery is matched to a company",
        "audit_log": "the operator's actions in one id order; company_id is NULL for global changes (plans, prices, routes)",
        "apple_notifications": "keyed by Apple's notificationUUID; company_id is NULL until the notification is matched",
        "apple_transactions": "original transaction id → company: the look-up a store notification needs to find its company",
        "ledger_exports": "one row per exported month of the whole ledger (all companies): retention's record, no company",
        "ledger_dropped_months": "one row per month retention dropped from the whole ledger (all companies), no company",
    ]

    /// Unique keys of distributed tables without the distribution column, which Citus refuses:
    /// what would have to change (docs/scale-out.md, "What would have to change").
    static let uniqueKeysToChange: [String: String] = [
        "api_keys_key_hash_key": "a key is found by its hash before its company is known: a routing table key_hash → company",
        "api_keys_id_key": "key ids are random UUIDs, also unique within (company_id, id): the extra constraint can go",
        "plan_periods_id_key": "period ids come from one identity and every reference is (company_id, id): can go",
        "topup_grants_transaction_id_key": "one grant per store purchase across companies: checked in a routing table",
        "companies_app_account_token": "the App Store's appAccountToken finds its company: a routing table token → company",
    ]

    /// Foreign keys Citus cannot keep (a coordinator table pointing at a distributed one).
    static let foreignKeysToChange: [String: String] = [
        "apple_notifications_company_id_fkey": "a coordinator table cannot reference a distributed one: checked by the code",
        "apple_transactions_company_id_fkey": "a coordinator table cannot reference a distributed one: checked by the code",
    ]

    @Test("every table is classified, and every tenant table carries company_id in its primary key or a unique key")
    func tenantTablesKeyedByCompany() async throws {
        try await Self.withSchema { schema in
            let classified = Self.distributed.union(Self.reference.keys).union(Self.coordinator.keys)
            #expect(Set(schema.tables.keys) == classified, "new: \(Set(schema.tables.keys).subtracting(classified).sorted())")
            #expect(Self.distributed.isDisjoint(with: Self.reference.keys) && Self.distributed.isDisjoint(with: Self.coordinator.keys))
            for (table, hasCompany) in schema.tables.sorted(by: { $0.key < $1.key }) {
                let keyed = schema.uniqueKeys.contains { $0.table == table && $0.columns.contains("company_id") }
                if Self.distributed.contains(table) && table != "companies" && Self.distributedWithoutKey[table] == nil {
                    #expect(hasCompany && keyed, "\(table): a tenant table without company_id in its primary key or a unique key")
                }
                if Self.reference.keys.contains(table) { #expect(!hasCompany, "\(table): a reference table holds no company's rows") }
                if hasCompany && !keyed {
                    #expect(Self.coordinator[table] != nil || Self.distributedWithoutKey[table] != nil, "\(table) has company_id in no key")
                }
            }
            #expect(schema.uniqueKeys.contains { $0.table == "companies" && $0.primary && $0.columns == ["id"] })
        }
    }

    @Test("what Citus requires of distributed tables: the distribution column in every unique key and in keys between them")
    func citusConstraints() async throws {
        try await Self.withSchema { schema in
            let uniqueViolations = Set(
                schema.uniqueKeys.filter { Self.distributed.contains($0.table) && !$0.columns.contains(Self.column(of: $0.table)) }
                    .map(\.name))
            #expect(uniqueViolations == Set(Self.uniqueKeysToChange.keys), "unique keys without the distribution column")
            let foreignViolations = Set(schema.foreignKeys.filter { !Self.citusKeeps($0) }.map(\.name))
            #expect(foreignViolations == Set(Self.foreignKeysToChange.keys), "foreign keys Citus would refuse")
            // Not vacuous: the rules did read keys of every kind.
            #expect(schema.foreignKeys.contains { $0.name == "api_keys_company_id_user_id_fkey" && Self.citusKeeps($0) })
            #expect(schema.uniqueKeys.contains { $0.name == "plan_periods_company_id_tstzrange_excl" })
        }
    }

    static func column(of table: String) -> String { table == "companies" ? "id" : "company_id" }

    /// Citus keeps a foreign key to a reference table from any table, one between two distributed
    /// tables that maps distribution column to distribution column, and one between coordinator
    /// tables; not one from a reference or coordinator table to a distributed one, or back.
    static func citusKeeps(_ key: Schema.ForeignKey) -> Bool {
        if reference[key.target] != nil { return true }
        if coordinator[key.table] != nil && coordinator[key.target] != nil { return true }
        guard distributed.contains(key.table) && distributed.contains(key.target) else { return false }
        return zip(key.columns, key.targetColumns).contains { $0 == column(of: key.table) && $1 == column(of: key.target) }
    }

    /// The tables, keys and foreign keys of a migrated database. A partition (the ledger's months,
    /// usage_ledger_pYYYYMM, 0026) is its partitioned table's, as Citus distributes it: not listed.
    struct Schema: Sendable {
        struct UniqueKey: Sendable {
            var table: String
            var name: String
            var primary: Bool
            var columns: [String]
        }
        struct ForeignKey: Sendable {
            var table: String
            var name: String
            var target: String
            var columns: [String]
            var targetColumns: [String]
        }
        /// Table name → whether it has a `company_id` column.
        var tables: [String: Bool] = [:]
        /// Primary keys, unique constraints and indexes, exclusion constraints (their columns).
        var uniqueKeys: [UniqueKey] = []
        var foreignKeys: [ForeignKey] = []
    }

    static func withSchema(_ body: @escaping @Sendable (Schema) throws -> Void) async throws {
        try await Harness.with { h in
            try body(try await read(h.db))
        }
    }

    static func read(_ db: PostgresClient) async throws -> Schema {
        let logger = TestCluster.logger
        var schema = Schema()
        let tables = try await db.query(
            """
            SELECT c.relname::text, EXISTS (SELECT 1 FROM pg_attribute a
                                             WHERE a.attrelid = c.oid AND a.attname = 'company_id' AND NOT a.attisdropped)
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
            """, logger: logger)
        for try await (name, hasCompany) in tables.decode((String, Bool).self) { schema.tables[name] = hasCompany }
        let keys = try await db.query(
            """
            SELECT c.relname::text, ic.relname::text, i.indisprimary,
                   array(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(num, pos)
                           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.num ORDER BY k.pos)
              FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_class ic ON ic.oid = i.indexrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND (i.indisunique OR i.indisexclusion) AND NOT c.relispartition
            """, logger: logger)
        for try await (table, name, primary, columns) in keys.decode((String, String, Bool, [String]).self) {
            schema.uniqueKeys.append(.init(table: table, name: name, primary: primary, columns: columns))
        }
        let foreign = try await db.query(
            """
            SELECT c.relname::text, k.conname::text, t.relname::text,
                   array(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY x(num, pos)
                           JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = x.num ORDER BY x.pos),
                   array(SELECT a.attname::text FROM unnest(k.confkey) WITH ORDINALITY x(num, pos)
                           JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = x.num ORDER BY x.pos)
              FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class t ON t.oid = k.confrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND k.contype = 'f'
            """, logger: logger)
        for try await (table, name, target, columns, targetColumns) in foreign.decode((String, String, String, [String], [String]).self) {
            schema.foreignKeys.append(.init(table: table, name: name, target: target, columns: columns, targetColumns: targetColumns))
        }
        return schema
    }
}
