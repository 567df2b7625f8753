import Foundation
import NIOCore
import PostgresNIO

// The metering hot path as named prepared statements: each pooled connection parses and plans
// them once, then only binds and executes (measured with pgbench, one call: 0.63 ms as an
// unnamed statement, 0.47 ms prepared). Parameter types come from the functions' signatures.

/// `capgate_admit`: one call without an Idempotency-Key: the API key's hash (looked up in the
/// same transaction) or a verified token's company and user. Called through the procedure
/// `capgate_admit_committed`, which commits before it answers: the row is the acknowledgement
/// of the commit, one round trip (issue #46). Its OUT parameters are `capgate_admitted`'s
/// columns in ``AdmittedColumn/names``' order, each passed as NULL, as a CALL requires.
struct AdmitStatement: SelfCommittingStatement {
    static let sql = """
        CALL capgate_admit_committed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
             \(Array(repeating: "NULL", count: AdmittedColumn.names.count).joined(separator: ", ")))
        """
    typealias Row = AdmissionRow

    var item: AdmissionItem
    var relaxed: Bool
    /// Calls that ended on this gateway whose slots may not be written free yet: not counted.
    var ended: [Int64] = []

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 17)
        let request = item.request
        bindings.append(item.keyHash)
        bindings.append(item.keyHash == nil ? request.companyID : nil)
        bindings.append(item.keyHash == nil ? request.userID : nil)
        bindings.append(Int32(clamping: request.units))
        bindings.append(request.method)
        bindings.append(request.route)
        bindings.append(request.model)
        bindings.append(request.feature)
        bindings.append(request.requestID)
        bindings.append(request.routesVersion)
        bindings.append(request.at)
        bindings.append(relaxed)
        request.bound.append(to: &bindings)
        bindings.append(ended)
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws -> AdmissionRow {
        try AdmissionRow(admitted: row)
    }
}

extension CostBound {
    /// `p_prompt, p_max_tokens, p_cache, p_window` of the admission functions (their "absent"
    /// values in SQLValues.swift).
    func append(to bindings: inout PostgresBindings) {
        bindings.append(promptParameter)
        bindings.append(maxTokensParameter)
        bindings.append(cache.rawValue)
        bindings.append(windowParameter)
    }
}

/// `capgate_admit_idempotent`: a call with an `Idempotency-Key` (never batched): the API key
/// (or a verified token's company and user), the key's claim and the admission, one call.
struct AdmitIdempotentStatement: PostgresPreparedStatement {
    static let sql = """
        SELECT \(AdmittedColumn.selectList)
          FROM capgate_admit_idempotent($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
        """
    typealias Row = AdmissionRow

    var keyHash: ByteBuffer?
    var request: AdmissionRequest
    var relaxed: Bool

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 18)
        bindings.append(keyHash)
        bindings.append(keyHash == nil ? request.companyID : nil)
        bindings.append(keyHash == nil ? request.userID : nil)
        bindings.append(Int32(clamping: request.units))
        bindings.append(request.method)
        bindings.append(request.route)
        bindings.append(request.model)
        bindings.append(request.feature)
        bindings.append(request.requestID)
        bindings.append(request.idempotencyKey)
        bindings.append(request.fingerprint)
        bindings.append(request.routesVersion)
        bindings.append(request.at)
        bindings.append(relaxed)
        request.bound.append(to: &bindings)
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws -> AdmissionRow {
        try AdmissionRow(admitted: row)
    }
}

/// `capgate_admit_batch`: many calls in one transaction, one array element per call. Arrays
/// cannot carry NULL elements from this driver, so "absent" is the empty value ('' or the nil
/// UUID, -1 for the routes version).
struct AdmitBatchStatement: PostgresPreparedStatement {
    static let sql = """
        SELECT \(AdmittedColumn.selectList)
          FROM capgate_admit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) ORDER BY item
        """
    typealias Row = AdmissionRow

    var items: [AdmissionItem]
    var relaxed: Bool
    /// Calls that ended on this gateway whose slots may not be written free yet: not counted.
    var ended: [Int64] = []

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 17)
        bindings.append(items.map { $0.keyHash ?? ByteBuffer() })
        bindings.append(items.map { $0.keyHash == nil ? $0.request.companyID : .zero })
        bindings.append(items.map { $0.keyHash == nil ? $0.request.userID : .zero })
        bindings.append(items.map { Int32(clamping: $0.request.units) })
        bindings.append(items.map(\.request.method))
        bindings.append(items.map(\.request.route))
        bindings.append(items.map { $0.request.model ?? "" })
        bindings.append(items.map { $0.request.feature ?? "" })
        bindings.append(items.map(\.request.requestID))
        bindings.append(items.map { $0.request.routesVersion ?? -1 })
        bindings.append(items.map(\.request.at))
        bindings.append(relaxed)
        bindings.append(items.map(\.request.bound.promptParameter))
        bindings.append(items.map(\.request.bound.maxTokensParameter))
        bindings.append(items.map(\.request.bound.cache.rawValue))
        bindings.append(items.map(\.request.bound.windowParameter))
        bindings.append(ended)
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws -> AdmissionRow {
        try AdmissionRow(admitted: row)
    }
}

/// `capgate_settle_batch`: upstream status and usage of many charges (-1 = a count not given),
/// and their ends in the rate windows; answers the calls that cost more than their hold.
struct SettleBatchStatement: PostgresPreparedStatement {
    static let sql = "SELECT company_id, ledger_id, hold, cost FROM capgate_settle_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    typealias Row = OverHold

    var items: [Settlement]

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 10)
        bindings.append(items.map(\.companyID))
        bindings.append(items.map(\.ledgerID))
        bindings.append(items.map(\.status))
        bindings.append(items.map { $0.usage.inputTokens ?? -1 })
        bindings.append(items.map { $0.usage.outputTokens ?? -1 })
        bindings.append(items.map { $0.usage.cacheWrite5m ?? -1 })
        bindings.append(items.map { $0.usage.cacheWrite1h ?? -1 })
        bindings.append(items.map { $0.usage.cacheRead ?? -1 })
        bindings.append(items.map(\.usage.known))
        bindings.append(items.map(\.windowTokens.parameter))
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws -> OverHold {
        let (company, ledger, hold, cost) = try row.decode((UUID, Int64, Int64, Int64).self)
        return OverHold(companyID: company, ledgerID: ledger, hold: hold, cost: cost)
    }
}

/// A settled call that cost more than its hold: the provider billed past the bound (SPEC §11).
struct OverHold: Sendable {
    var companyID: UUID
    var ledgerID: Int64
    var hold: Int64
    var cost: Int64
}
