import Foundation

/// Reads `PUT /admin/v1/prices`'s `{"prices": [row, …]}` strictly and checks the whole book
/// before anything is written: the first problem is a 400 that names the row (its index and
/// model) and what is wrong, and the book stays as it was.
///
/// Rules (docs/budgets.md "Price book", openapi.yaml `PriceRow`): every documented member and no other
/// (`long_prompt` is optional, SPEC §11: absent or `null` when the model has no long-prompt tier); `model` 1 to 200 printable ASCII characters without spaces, `*` only as the last one;
/// `effective_from` an RFC 3339 date-time from 1970 to 9999, kept to the (nearest) millisecond; `context_window` and
/// `long_prompt.threshold_tokens` whole numbers from 1 to 100,000,000, the threshold below the
/// window; rates decimal strings of USD per million tokens (``Micros``), at most 10,000; no
/// two rows with the same model and `effective_from`; at most ``maxRows`` rows.
struct PriceBookReader {
    /// The most rows a book may have.
    static let maxRows = 10_000
    /// The largest body `PUT /admin/v1/prices` reads: room for ``maxRows`` rows with long tiers.
    static let maxBodyBytes = 8 << 20

    static let rowMembers: Set<String> = [
        "model", "effective_from", "context_window", "input", "output", "cache_write_5m", "cache_write_1h", "cache_read",
        "long_prompt",
    ]
    static let longPromptMembers: Set<String> = ["threshold_tokens", "input", "output", "cache_write_5m", "cache_write_1h", "cache_read"]

    /// The book in `fields` (a body read by ``BodyFields``), in the order given.
    static func read(_ fields: BodyFields) throws -> [PriceRecord] {
        if let unknown = fields.fields.keys.filter({ $0 != "prices" }).sorted().first {
            throw GatewayError.invalidRequest("Unknown member '\(unknown)': the body is {\"prices\": [row, …]}.")
        }
        guard let rows = fields.fields["prices"]?.arrayValue else {
            throw GatewayError.invalidRequest("'prices' is required: a list of price rows (it replaces the whole book).")
        }
        guard rows.count <= maxRows else {
            throw GatewayError.invalidRequest("'prices' has \(rows.count) rows; a book has at most \(maxRows).")
        }
        var book: [PriceRecord] = []
        book.reserveCapacity(rows.count)
        var seen: [String: Int] = [:]
        for (index, row) in rows.enumerated() {
            let price = try Row(index: index, json: row).read()
            let key = price.model + " " + PriceRecord.timeText(price.effectiveFrom)
            if let first = seen[key] {
                throw Row(index: index, json: row).problem(
                    "repeats prices[\(first)]: one row per model and effective_from (\(PriceRecord.timeText(price.effectiveFrom))).")
            }
            seen[key] = index
            book.append(price)
        }
        return book
    }

    /// One row, read member by member.
    struct Row {
        let index: Int
        let json: JSON

        /// `prices[3] (model 'claude-x'): <what>`.
        func problem(_ what: String) -> GatewayError {
            let model = json["model"]?.stringValue.map { " (model '\(Self.shown($0))')" } ?? ""
            return GatewayError.invalidRequest("prices[\(index)]\(model): \(what)")
        }

        /// A model as a message may show it: at most 200 characters, control characters escaped.
        static func shown(_ model: String) -> String {
            String(String.UnicodeScalarView(model.unicodeScalars.prefix(200).map { $0.value < 0x20 || $0 == "\u{7f}" ? "?" : $0 }))
        }

        func read() throws -> PriceRecord {
            guard let members = json.objectFields else { throw problem("a row must be a JSON object.") }
            try checkMembers(members, allowed: PriceBookReader.rowMembers, optional: ["long_prompt"], in: "")
            let model = try readModel()
            let window = try tokens("context_window", json["context_window"])
            let rates = try readRates(json, in: "")
            var longPrompt: PriceRecord.LongPrompt?
            if let tier = json["long_prompt"], !tier.isNull {
                guard let tierMembers = tier.objectFields else {
                    throw problem("'long_prompt' must be null or an object with threshold_tokens and the five rates.")
                }
                try checkMembers(tierMembers, allowed: PriceBookReader.longPromptMembers, in: "long_prompt.")
                let threshold = try tokens("long_prompt.threshold_tokens", tier["threshold_tokens"])
                guard threshold < window else {
                    throw problem("'long_prompt.threshold_tokens' (\(threshold)) must be below 'context_window' (\(window)).")
                }
                longPrompt = PriceRecord.LongPrompt(thresholdTokens: threshold, rates: try readRates(tier, in: "long_prompt."))
            }
            return PriceRecord(
                model: model, effectiveFrom: try readEffectiveFrom(), contextWindow: window, rates: rates, longPrompt: longPrompt)
        }

        func checkMembers(_ members: [JSON.Field], allowed: Set<String>, optional: Set<String> = [], in prefix: String) throws {
            if let unknown = members.map(\.key).first(where: { !allowed.contains($0) }) {
                throw problem("unknown member '\(prefix)\(Self.shown(unknown))'.")
            }
            if let missing = allowed.subtracting(optional).subtracting(members.map(\.key)).sorted().first {
                throw problem("'\(prefix)\(missing)' is required.")
            }
        }

        func readModel() throws -> String {
            let rule =
                "'model' must be an exact model id or a prefix ending in '*': 1 to 200 printable ASCII characters without spaces, '*' only last."
            guard let model = json["model"]?.stringValue else { throw problem(rule) }
            let scalars = Array(model.unicodeScalars)
            guard (1...200).contains(scalars.count), scalars.allSatisfy({ (0x21...0x7e).contains($0.value) }),
                !scalars.dropLast().contains("*")
            else { throw problem(rule) }
            return model
        }

        func readEffectiveFrom() throws -> Date {
            let rule = "'effective_from' must be an RFC 3339 date-time from 1970 to 9999 such as 2026-11-01T00:00:00Z."
            guard let text = json["effective_from"]?.stringValue, text.utf8.count <= 64, let date = Timestamp.parseStrict(text),
                (0..<253_402_300_800).contains(date.timeIntervalSince1970)
            else { throw problem(rule) }
            return date
        }

        func tokens(_ name: String, _ value: JSON?) throws -> Int32 {
            guard let number = value?.intValue, (1...Int64(PriceRecord.maxTokens)).contains(number) else {
                throw problem("'\(name)' must be a whole number of tokens from 1 to \(PriceRecord.maxTokens).")
            }
            return Int32(number)
        }

        func readRates(_ object: JSON, in prefix: String) throws -> PriceRecord.Rates {
            func rate(_ name: String) throws -> Micros {
                guard let text = object[name]?.stringValue, let amount = Micros(decimal: text), amount <= PriceRecord.maxRate else {
                    throw problem(
                        "'\(prefix)\(name)' must be a decimal string of USD per million tokens from \"0\" to \"\(PriceRecord.maxRate.decimal)\" with at most 6 decimals, such as \"3.75\"."
                    )
                }
                return amount
            }
            return PriceRecord.Rates(
                input: try rate("input"), output: try rate("output"), cacheWrite5m: try rate("cache_write_5m"),
                cacheWrite1h: try rate("cache_write_1h"), cacheRead: try rate("cache_read"))
        }
    }
}
