import CapGate
import Foundation
import Logging
import PostgresNIO

/// The demo's price book (SPEC §11): Anthropic's list prices per million tokens for the Claude
/// models the demo and its users call, by model family (prefix rows), so that every id of a
/// family (`claude-sonnet-4-6`, the one the demo's examples call, `claude-sonnet-4-5-20250929`, …)
/// is priced. Source and date: docs/budgets.md "Price book" (Anthropic's pricing page, read 2026-11-25).
extension DemoSeed {
    /// From when the seeded rows apply: before the demo's history (last month), so it is priced too.
    static let pricesEffectiveFrom = Date(timeIntervalSince1970: 1_735_689_600)  // 2025-01-01T00:00:00Z

    /// model, context window, input, output, 5-minute cache write, 1-hour cache write, cache read
    /// (USD per million tokens), and the long-prompt tier (threshold, then the same five rates).
    static let listPrices: [(model: String, window: Int32, rates: [String], long: (threshold: Int32, rates: [String])?)] = [
        // Opus 4.5 and later Opus 4 models (4.6 and later have a 1M window; the largest bounds a hold).
        ("claude-opus-4*", 1_000_000, ["5", "25", "6.25", "10", "0.5"], nil),
        // Opus 4 and 4.1 kept the earlier price.
        ("claude-opus-4-0*", 200_000, ["15", "75", "18.75", "30", "1.5"], nil),
        ("claude-opus-4-1*", 200_000, ["15", "75", "18.75", "30", "1.5"], nil),
        ("claude-opus-4-20250514", 200_000, ["15", "75", "18.75", "30", "1.5"], nil),
        // Sonnet 4, 4.5 (and 4.6): a 1M window, every token at the long rates over 200K prompt tokens.
        ("claude-sonnet-4*", 1_000_000, ["3", "15", "3.75", "6", "0.3"], (200_000, ["6", "22.5", "7.5", "12", "0.6"])),
        ("claude-3-7-sonnet*", 200_000, ["3", "15", "3.75", "6", "0.3"], nil),
        ("claude-haiku-4-5*", 200_000, ["1", "5", "1.25", "2", "0.1"], nil),
        ("claude-3-5-haiku*", 200_000, ["0.8", "4", "1", "1.6", "0.08"], nil),
        ("claude-3-haiku*", 200_000, ["0.25", "1.25", "0.3", "0.5", "0.03"], nil),
    ]

    /// The rows of ``listPrices``.
    static var priceBook: [PriceRecord] {
        func rates(_ texts: [String]) -> PriceRecord.Rates {
            let m = texts.map { Micros(decimal: $0)! }
            return PriceRecord.Rates(input: m[0], output: m[1], cacheWrite5m: m[2], cacheWrite1h: m[3], cacheRead: m[4])
        }
        return listPrices.map { row in
            PriceRecord(
                model: row.model, effectiveFrom: pricesEffectiveFrom, contextWindow: row.window, rates: rates(row.rates),
                longPrompt: row.long.map { PriceRecord.LongPrompt(thresholdTokens: $0.threshold, rates: rates($0.rates)) })
        }
    }

    /// Seeds the book when it is empty (a book the operator changed stays as they left it).
    static func seedPrices(_ connection: PostgresConnection, logger: Logger) async throws {
        let existing = try await connection.query("SELECT count(*)::bigint FROM prices", logger: logger).decode(Int64.self).collect()
        guard existing.first == 0 else { return }
        try await PriceStore.replace(priceBook, on: connection, logger: logger)
    }
}
