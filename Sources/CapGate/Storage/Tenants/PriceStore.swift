import Foundation
import Logging
import PostgresNIO

/// The price book (SPEC §11) in PostgreSQL: the `prices` table, read whole and replaced whole.
/// Which row prices a call is `capgate_price` (db/functions/capgate_price.sql), for the admission.
public struct PriceStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// The book by model (byte order) then `effective_from`.
    public func book() async throws -> [PriceRecord] {
        try await database.run { client in
            try await Self.rows(try await client.query(Self.select, logger: logger))
        }
    }

    /// Replaces the whole book with `book` (already checked by ``PriceBookReader``) in one
    /// transaction, and answers it as stored. Concurrent replacements take turns (a table lock
    /// that readers, such as the admission, do not wait for); the last one to commit is the book.
    public func replace(_ book: [PriceRecord], by actor: AuditActor? = nil) async throws -> [PriceRecord] {
        do {
            return try await database.audited(actor) { connection in
                try await connection.query("LOCK TABLE prices IN SHARE ROW EXCLUSIVE MODE", logger: self.logger)
                let before = try await AuditLog.snapshot(AuditLog.prices, on: connection, logger: self.logger)
                try await Self.replace(book, on: connection, logger: self.logger)
                let after = try await AuditLog.snapshot(AuditLog.prices, on: connection, logger: self.logger)
                let stored = try await Self.rows(try await connection.query(Self.select, logger: self.logger))
                return (stored, AuditEntry(action: "price_book.replace", companyID: nil, targetID: "prices", before: before, after: after))
            }
        } catch DatabaseError.constraint(_, let constraint, _) {
            throw GatewayError.invalidRequest("The price book breaks the database rule '\(constraint ?? "?")'; nothing was changed.")
        }
    }

    /// The statements of ``replace(_:)``, for a caller that holds its own transaction (the demo seed).
    public static func replace(_ book: [PriceRecord], on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query("LOCK TABLE prices IN SHARE ROW EXCLUSIVE MODE", logger: logger)
        try await connection.query("DELETE FROM prices", logger: logger)
        guard !book.isEmpty else { return }
        // One statement for the whole book (up to 10,000 rows): the rows as one jsonb parameter.
        let rows = JSON.array(book.map(Self.json)).serialized()
        try await connection.query(
            """
            INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read,
                                long_prompt_threshold, long_prompt_input, long_prompt_output, long_prompt_cache_write_5m,
                                long_prompt_cache_write_1h, long_prompt_cache_read)
            SELECT model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read,
                   long_prompt_threshold, long_prompt_input, long_prompt_output, long_prompt_cache_write_5m,
                   long_prompt_cache_write_1h, long_prompt_cache_read
              FROM jsonb_to_recordset(\(rows)::jsonb) AS r(
                   model text, effective_from timestamptz, context_window integer, input bigint, output bigint,
                   cache_write_5m bigint, cache_write_1h bigint, cache_read bigint, long_prompt_threshold integer,
                   long_prompt_input bigint, long_prompt_output bigint, long_prompt_cache_write_5m bigint,
                   long_prompt_cache_write_1h bigint, long_prompt_cache_read bigint)
            """,
            logger: logger)
    }

    /// A row as `jsonb_to_recordset` reads it: the table's columns, money in micro-dollars.
    static func json(_ p: PriceRecord) -> JSON {
        let tier = p.longPrompt
        return .obj([
            "model": .string(p.model), "effective_from": .string(PriceRecord.timeText(p.effectiveFrom)),
            "context_window": .int(Int64(p.contextWindow)), "input": .int(p.rates.input.value), "output": .int(p.rates.output.value),
            "cache_write_5m": .int(p.rates.cacheWrite5m.value), "cache_write_1h": .int(p.rates.cacheWrite1h.value),
            "cache_read": .int(p.rates.cacheRead.value), "long_prompt_threshold": JSON(tier.map { Int64($0.thresholdTokens) }),
            "long_prompt_input": JSON(tier?.rates.input.value), "long_prompt_output": JSON(tier?.rates.output.value),
            "long_prompt_cache_write_5m": JSON(tier?.rates.cacheWrite5m.value),
            "long_prompt_cache_write_1h": JSON(tier?.rates.cacheWrite1h.value), "long_prompt_cache_read": JSON(tier?.rates.cacheRead.value),
        ])
    }

    static let select: PostgresQuery = """
        SELECT model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read,
               long_prompt_threshold, long_prompt_input, long_prompt_output, long_prompt_cache_write_5m,
               long_prompt_cache_write_1h, long_prompt_cache_read
          FROM prices ORDER BY model COLLATE "C", effective_from
        """

    /// The rows of ``select``, read by name.
    static func rows(_ rows: PostgresRowSequence) async throws -> [PriceRecord] {
        var book: [PriceRecord] = []
        for try await row in rows {
            let r = row.makeRandomAccess()
            let model: String = try r.column("model")
            guard let rates = try Self.rates(r, prefix: "") else { throw DatabaseError.other("the price of \(model) has NULL rates") }
            var tier: PriceRecord.LongPrompt?
            if let threshold = try r.column("long_prompt_threshold", as: Int32?.self), let long = try Self.rates(r, prefix: "long_prompt_")
            {
                tier = PriceRecord.LongPrompt(thresholdTokens: threshold, rates: long)
            }
            book.append(
                PriceRecord(
                    model: model, effectiveFrom: try r.column("effective_from"), contextWindow: try r.column("context_window"),
                    rates: rates, longPrompt: tier))
        }
        return book
    }

    /// The five rates of a row (`input`, `output`, `cache_write_5m`, `cache_write_1h`,
    /// `cache_read`, after `prefix`), in micro-dollars; nil when one is NULL.
    static func rates(_ r: PostgresRandomAccessRow, prefix: String) throws -> PriceRecord.Rates? {
        guard let input = try r.column(prefix + "input", as: Int64?.self), let output = try r.column(prefix + "output", as: Int64?.self),
            let write5m = try r.column(prefix + "cache_write_5m", as: Int64?.self),
            let write1h = try r.column(prefix + "cache_write_1h", as: Int64?.self),
            let read = try r.column(prefix + "cache_read", as: Int64?.self)
        else { return nil }
        return PriceRecord.Rates(
            input: Micros(input), output: Micros(output), cacheWrite5m: Micros(write5m), cacheWrite1h: Micros(write1h),
            cacheRead: Micros(read))
    }
}
