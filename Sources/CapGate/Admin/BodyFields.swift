import Foundation
import Hummingbird

/// A JSON object body read field by field, with a clear 400 naming the field on bad input.
struct BodyFields {
    let fields: [String: JSON]
    /// Whether the body holds a NUL character (`\u0000`) anywhere, read or not. PostgreSQL
    /// text and jsonb cannot hold it: a field that is read refuses it (``string(_:required:maxLength:)``),
    /// and a route that stores the whole body checks this.
    let containsNUL: Bool

    /// The body, up to `limit` bytes (default the context's `maxUploadSize`; larger is 413).
    /// `emptyIsObject`: no body at all reads as `{}` (a route whose every field is optional).
    static func read(
        _ request: Request, context: some RequestContext, limit: Int? = nil, emptyIsObject: Bool = false
    ) async throws -> BodyFields {
        let limit = limit ?? context.maxUploadSize
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: limit)
        } catch let error as GatewayError {
            throw error  // http.bodyTimeout's 408
        } catch {
            throw GatewayError(.contentTooLarge, "request_too_large", "The request body is larger than \(limit) bytes.")
        }
        guard buffer.readableBytes > 0 else {
            if emptyIsObject { return BodyFields(fields: [:], containsNUL: false) }
            throw GatewayError.invalidRequest("The request needs a JSON object body.")
        }
        let containsNUL = buffer.readableBytesView.containsSequence(Array("\\u0000".utf8))
        let json: JSON
        do {
            json = try JSON.parse(buffer)
        } catch {
            throw GatewayError.invalidRequest("The request body is not one valid JSON text (I-JSON, RFC 7493): \(error).")
        }
        guard let object = json.objectFields else {
            throw GatewayError.invalidRequest("The request body must be a JSON object.")
        }
        return BodyFields(
            fields: Dictionary(object.map { ($0.key, $0.value) }, uniquingKeysWith: { _, b in b }), containsNUL: containsNUL)
    }

    func has(_ key: String) -> Bool { fields[key] != nil }

    /// A user's role (`member` or `admin`); nil when absent.
    func role(_ key: String) throws -> UserIdentity.Role? {
        guard let text = try string(key, maxLength: 10) else { return nil }
        guard let role = UserIdentity.Role(rawValue: text) else {
            throw GatewayError.invalidRequest("'\(key)' must be 'member' or 'admin'.")
        }
        return role
    }

    func string(_ key: String, required: Bool = false, maxLength: Int = 200) throws -> String? {
        guard let value = fields[key], !value.isNull else {
            if required { throw GatewayError.invalidRequest("'\(key)' is required.") }
            return nil
        }
        guard let s = value.stringValue else { throw GatewayError.invalidRequest("'\(key)' must be a string.") }
        guard !s.isEmpty, s.unicodeScalars.count <= maxLength else {
            throw GatewayError.invalidRequest("'\(key)' must be 1 to \(maxLength) characters.")
        }
        // PostgreSQL text cannot hold NUL: refuse it here rather than fail in the database.
        if containsNUL, s.unicodeScalars.contains("\u{0}") {
            throw GatewayError.invalidRequest("'\(key)' must not contain NUL (\\u0000) characters.")
        }
        return s
    }

    func requiredString(_ key: String, maxLength: Int = 200) throws -> String {
        try string(key, required: true, maxLength: maxLength)!
    }

    /// A non-negative integer or `null`; `.absent` when the key is missing.
    enum Cap { case absent, null, value(Int64) }

    /// The largest cap (10^15 units); `null` is unlimited.
    static let maxCap: Int64 = 1_000_000_000_000_000

    func cap(_ key: String) throws -> Cap {
        guard let value = fields[key] else { return .absent }
        if value.isNull { return .null }
        // A whole number written with a fraction (`5.0`) is an integer in JSON Schema too.
        guard let i = value.intValue, (0...Self.maxCap).contains(i) else {
            throw GatewayError.invalidRequest("'\(key)' must be a whole number from 0 to \(Self.maxCap), or null for unlimited.")
        }
        return .value(i)
    }

    /// A cap or limit for an update: the body's value (`null` = unlimited), or when the body
    /// leaves it out, the current one in `existing` (nil there: unlimited).
    func cap(_ key: String, keeping existing: JSON?) throws -> Int64? {
        try cap(key, keeping: existing?[key]?.intValue)
    }

    /// As ``cap(_:keeping:)-(_,JSON?)``, with the current value itself (nil: unlimited).
    func cap(_ key: String, keeping current: Int64?) throws -> Int64? {
        switch try cap(key) {
        case .absent: return current
        case .null: return nil
        case .value(let v): return v
        }
    }

    /// A per-minute or in-flight limit (SPEC §14): a whole number from 0 to `max`, or `null` for
    /// none; when the body leaves it out, `current`.
    func rateLimit(_ key: String, max: Int64, keeping current: Int64?) throws -> Int64? {
        guard let value = fields[key] else { return current }
        if value.isNull { return nil }
        guard let i = value.intValue, (0...max).contains(i) else {
            throw GatewayError.invalidRequest("'\(key)' must be a whole number from 0 to \(max), or null for none.")
        }
        return i
    }

    /// The five limits of SPEC §14 on a plan, each kept from `current` when the body leaves it out.
    func rateLimits(keeping current: RateState.Limits) throws -> RateState.Limits {
        RateState.Limits(
            companyRPM: try rateLimit("company_rpm", max: 1_000_000_000, keeping: current.companyRPM),
            companyTPM: try rateLimit("company_tpm", max: 1_000_000_000_000, keeping: current.companyTPM),
            userRPM: try rateLimit("user_rpm", max: 1_000_000_000, keeping: current.userRPM),
            userTPM: try rateLimit("user_tpm", max: 1_000_000_000_000, keeping: current.userTPM),
            userConcurrency: try rateLimit("user_concurrency", max: 1_000_000, keeping: current.userConcurrency))
    }

    /// A cost budget (SPEC §11): a decimal string of US dollars or `null`; `.absent` when the key
    /// is missing.
    enum Budget: Equatable { case absent, null, value(Micros) }

    /// A budget field: a decimal string of US dollars with at most 6 decimals from `"0"` to
    /// ``Micros/max`` (``Micros/init(decimal:)``: no sign, exponent, spaces or leading zeros), or
    /// `null` for unlimited. A JSON number is refused too: money crosses the wire as text, so a
    /// binary floating point never decides a budget. Anything else is 400 naming the field.
    func budget(_ key: String) throws -> Budget {
        guard let value = fields[key] else { return .absent }
        if value.isNull { return .null }
        guard let text = value.stringValue, let amount = Micros(decimal: text) else {
            throw GatewayError.invalidRequest(
                "'\(key)' must be a decimal string of US dollars from \"0\" to \"\(Micros.max.decimal)\" with at most 6 decimals, "
                    + "such as \"50\" or \"12.345678\", or null for unlimited.")
        }
        return .value(amount)
    }

    /// A budget for a create or an update: the body's value (`null` = unlimited), or when the body
    /// leaves it out, `current` (nil: unlimited).
    func budget(_ key: String, keeping current: Micros?) throws -> Micros? {
        switch try budget(key) {
        case .absent: return current
        case .null: return nil
        case .value(let amount): return amount
        }
    }

    /// The id of the resource a body creates or changes: for a change, the id in the path (an
    /// `id` in the body must equal it); for a create, the body's `id` (`generated` when the body
    /// has none and one may be made), which `isValid` must accept.
    func resourceID(
        path: String?, what: String, isValid: (String) -> Bool, rule: String, generated: (() -> String)? = nil
    ) throws -> String {
        if let path {
            if let bodyID = try string("id", maxLength: 64), bodyID != path {
                throw GatewayError.invalidRequest("'id' in the body does not match the \(what) in the path.")
            }
            return path
        }
        let id = try generated.map { try string("id", maxLength: 64) ?? $0() } ?? requiredString("id", maxLength: 64)
        guard isValid(id) else { throw GatewayError.invalidRequest("'id' must be \(rule).") }
        return id
    }

    func bool(_ key: String) throws -> Bool? {
        guard let value = fields[key], !value.isNull else { return nil }
        guard let b = value.boolValue else { throw GatewayError.invalidRequest("'\(key)' must be true or false.") }
        return b
    }

    func int(_ key: String, range: ClosedRange<Int64>) throws -> Int64? {
        guard let value = fields[key], !value.isNull else { return nil }
        guard let i = value.intValue, range.contains(i) else {
            throw GatewayError.invalidRequest("'\(key)' must be a whole number from \(range.lowerBound) to \(range.upperBound).")
        }
        return i
    }

    /// An amount of money with at most 2 decimals from 0 to 9999999999.99 (a `numeric(14,2)`
    /// column), as a JSON number or a numeric string, read exactly. A JSON number is taken as
    /// the shortest decimal text of its binary value (`19.99`, never `19.989999…`), which is
    /// the text that was sent for any number of up to 15 significant digits. More decimals, a
    /// sign, an exponent or a larger value is 400: refused rather than rounded.
    func money(_ key: String) throws -> Decimal? {
        guard let value = fields[key], !value.isNull else { return nil }
        let text: String? =
            switch value {
            case .int(let i): String(i)
            case .double(let d) where d == 0: "0"
            case .double(let d) where d.isFinite: String(d)
            case .string(let s): s.hasPrefix("+") ? String(s.dropFirst()) : s
            default: nil
            }
        if let text, let amount = Self.money(text) { return amount }
        throw GatewayError.invalidRequest("'\(key)' must be a number from 0 to 9999999999.99 with at most 2 decimals.")
    }

    /// `^([0-9]{1,10}(\.[0-9]{0,2})?|\.[0-9]{1,2})$` as an exact ``Decimal``; nil for anything else.
    static func money(_ text: String) -> Decimal? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard let whole = parts.first, parts.count <= 2 else { return nil }
        let cents = parts.count == 2 ? parts[1] : ""
        func digits(_ s: Substring) -> Bool { s.unicodeScalars.allSatisfy { ("0"..."9").contains($0) } }
        guard digits(whole), digits(cents), whole.count <= 10, cents.count <= 2, !(whole.isEmpty && cents.isEmpty) else {
            return nil
        }
        return Decimal(string: "\(whole.isEmpty ? "0" : whole).\(cents.isEmpty ? "0" : cents)", locale: Locale(identifier: "en_US_POSIX"))
    }

    /// A list of feature ids (SPEC §8's bindings), duplicates dropped; nil when absent or `null`.
    /// Whether each names a feature is the caller's check (``FeatureStore/unknownFeatures(_:)``).
    func featureIDs(_ key: String, allowEmpty: Bool) throws -> [String]? {
        guard let value = fields[key], !value.isNull else { return nil }
        let rule = "'\(key)' must be a list of \(allowEmpty ? "0" : "1") to 100 feature ids, or null"
        guard let items = value.arrayValue, items.count <= 100, allowEmpty || !items.isEmpty else {
            throw GatewayError.invalidRequest(rule + ".")
        }
        var ids: [String] = []
        for item in items {
            guard let id = item.stringValue, CallCost.isFeatureID(id) else {
                throw GatewayError.invalidRequest(rule + "; \(item.serialized()) is not a feature id.")
            }
            if !ids.contains(id) { ids.append(id) }
        }
        return ids
    }

    func uuid(_ key: String, required: Bool = false) throws -> UUID? {
        guard let s = try string(key, required: required, maxLength: 64) else { return nil }
        guard let id = UUID(uuidString: s) else { throw GatewayError.invalidRequest("'\(key)' must be a UUID.") }
        return id
    }

    func date(_ key: String) throws -> Date? {
        guard let s = try string(key, maxLength: 64) else { return nil }
        guard let d = Timestamp.parse(s) else {
            throw GatewayError.invalidRequest("'\(key)' must be an ISO-8601 time such as 2026-11-01T00:00:00Z.")
        }
        return d
    }
}

extension Parameters {
    /// A UUID path parameter, 404 when it is not one (an id that cannot exist).
    func uuid(_ name: String, what: String) throws -> UUID {
        guard let text = self.get(name), let id = UUID(uuidString: text) else {
            throw GatewayError.notFound("No \(what) with that id.")
        }
        return id
    }
}

extension Collection where Element == UInt8 {
    /// Whether `needle` occurs in these bytes (ASCII case-insensitively).
    func containsSequence(_ needle: [UInt8]) -> Bool {
        guard needle.count <= count else { return false }
        let bytes = Array(self)
        outer: for start in 0...(bytes.count - needle.count) {
            for (offset, byte) in needle.enumerated() where bytes[start + offset] | 0x20 != byte | 0x20 {
                continue outer
            }
            return true
        }
        return false
    }
}
