import Foundation
import NIOCore

/// A JSON value with ordered object keys.
///
/// CapGate builds every response body with this type instead of `Codable` so that `null` is
/// always written explicitly (the SPEC requires `"limit": null` for unlimited caps) and keys
/// appear in a stable, documented order.
public enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSON])
    case object([Field])

    /// One key of an object, in order.
    public struct Field: Sendable, Equatable {
        public var key: String
        public var value: JSON
        public init(_ key: String, _ value: JSON) {
            self.key = key
            self.value = value
        }
    }

    /// Builds an object from key/value pairs, keeping their order.
    public static func obj(_ pairs: KeyValuePairs<String, JSON>) -> JSON {
        .object(pairs.map { Field($0.key, $0.value) })
    }

    public subscript(key: String) -> JSON? {
        guard case .object(let fields) = self else { return nil }
        return fields.first { $0.key == key }?.value
    }

    /// This value with every NUL (U+0000) in its strings and keys replaced by U+FFFD, for jsonb
    /// (which cannot hold NUL); itself when `needed` is false.
    func replacingNUL(when needed: Bool = true) -> JSON {
        guard needed else { return self }
        func clean(_ s: String) -> String {
            s.unicodeScalars.contains("\u{0}")
                ? String(String.UnicodeScalarView(s.unicodeScalars.map { $0 == "\u{0}" ? "\u{FFFD}" : $0 })) : s
        }
        switch self {
        case .string(let s): return .string(clean(s))
        case .array(let a): return .array(a.map { $0.replacingNUL() })
        case .object(let fields): return .object(fields.map { Field(clean($0.key), $0.value.replacingNUL()) })
        default: return self
        }
    }

    public var isNull: Bool { if case .null = self { true } else { false } }

    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    public var intValue: Int64? {
        switch self {
        case .int(let i): return i
        case .double(let d) where d.rounded() == d && abs(d) < 9e15: return Int64(d)
        default: return nil
        }
    }

    public var doubleValue: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }

    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    public var objectFields: [Field]? {
        if case .object(let f) = self { return f }
        return nil
    }

    public var arrayValue: [JSON]? {
        if case .array(let a) = self { return a }
        return nil
    }

    /// Walks a dotted path such as `app_metadata.company_id`.
    public func value(atPath path: String) -> JSON? {
        var current: JSON? = self
        for part in path.split(separator: ".") {
            current = current?[String(part)]
        }
        return current
    }
}

extension JSON {
    public init(_ value: String?) { self = value.map(JSON.string) ?? .null }
    public init(_ value: Int64?) { self = value.map(JSON.int) ?? .null }
    public init(_ value: Int?) { self = value.map { .int(Int64($0)) } ?? .null }
    public init(_ value: Bool?) { self = value.map(JSON.bool) ?? .null }
    public init(_ value: Date?) { self = value.map { .string(Timestamp.format($0)) } ?? .null }
    public init(_ value: UUID?) { self = value.map { .string($0.uuidString.lowercased()) } ?? .null }
}

/// Literals, so a body or an answer reads as what it is: `.obj(["type": "error", "count": 1])`.
extension JSON: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral, ExpressibleByFloatLiteral {
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}

// MARK: - Parsing

extension JSON: Decodable {
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() {
            self = .null
        } else if let b = try? c.decode(Bool.self) {
            self = .bool(b)
        } else if let i = try? c.decode(Int64.self) {
            self = .int(i)
        } else if let d = try? c.decode(Double.self) {
            self = .double(d)
        } else if let s = try? c.decode(String.self) {
            self = .string(s)
        } else if let a = try? c.decode([JSON].self) {
            self = .array(a)
        } else {
            let dict = try c.decode([String: JSON].self)
            self = .object(dict.sorted { $0.key < $1.key }.map { Field($0.key, $0.value) })
        }
    }

    /// Parses JSON text with the strict I-JSON reader (``JSONParser``); throws
    /// ``JSONParser/Failure`` on anything else.
    public static func parse(_ bytes: some Collection<UInt8>) throws -> JSON {
        try JSONParser.parse(bytes)
    }

    public static func parse(_ buffer: ByteBuffer) throws -> JSON {
        try JSONParser.parse(buffer)
    }

    /// The values of `keys` in a top-level JSON object, building nothing else; empty when the
    /// text is not an I-JSON object.
    public static func topLevelValues(_ keys: Set<String>, in buffer: ByteBuffer) -> [String: JSON] {
        (try? JSONParser.members(keys, in: buffer))?.values ?? [:]
    }
}

// MARK: - Serialising

extension JSON {
    /// Compact JSON text.
    public func serialized() -> String {
        var out = ""
        out.reserveCapacity(256)
        write(into: &out)
        return out
    }

    public func byteBuffer() -> ByteBuffer {
        ByteBuffer(string: serialized())
    }

    func write(into out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let i): out += String(i)
        case .double(let d):
            if d.isFinite {
                if d.rounded() == d && abs(d) < 1e15 { out += String(Int64(d)) } else { out += String(d) }
            } else {
                out += "null"
            }
        case .string(let s): JSON.writeString(s, into: &out)
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                item.write(into: &out)
            }
            out += "]"
        case .object(let fields):
            out += "{"
            for (i, field) in fields.enumerated() {
                if i > 0 { out += "," }
                JSON.writeString(field.key, into: &out)
                out += ":"
                field.value.write(into: &out)
            }
            out += "}"
        }
    }

    static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out +=
                    "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                    + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

extension JSON: Encodable {
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let fields):
            try c.encode(Dictionary(fields.map { ($0.key, $0.value) }, uniquingKeysWith: { _, last in last }))
        }
    }
}
