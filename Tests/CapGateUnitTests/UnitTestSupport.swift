import Foundation
import Testing

@testable import CapGate

/// Small helpers the unit suites share: the refusal a throwing step gave, and exact times.
enum UnitTestSupport {
    /// The ``GatewayError`` `body` threw, or nil when it threw nothing (or something else).
    static func refusal(_ body: () throws -> Void) -> GatewayError? {
        do {
            try body()
            return nil
        } catch let error as GatewayError {
            return error
        } catch {
            Issue.record("expected a GatewayError, got \(error)")
            return nil
        }
    }

    /// The message of the refusal `body` threw (nil when it threw none).
    static func refusalMessage(_ body: () throws -> Void) -> String? { refusal(body)?.message }

    /// A time written as RFC 3339 (read strictly); the test fails on a typo.
    static func time(_ text: String) -> Date {
        guard let date = Timestamp.parseStrict(text) else {
            Issue.record("not an RFC 3339 time: \(text)")
            return Date(timeIntervalSince1970: 0)
        }
        return date
    }

    /// Why `text` is not I-JSON for the reader, or nil when it reads whole.
    static func jsonFailure(_ text: String, maxDepth: Int = JSONParser.defaultMaxDepth) -> JSONParser.Failure? {
        jsonFailure(bytes: Array(text.utf8), maxDepth: maxDepth)
    }

    static func jsonFailure(bytes: [UInt8], maxDepth: Int = JSONParser.defaultMaxDepth) -> JSONParser.Failure? {
        do {
            _ = try JSONParser.parse(bytes, maxDepth: maxDepth)
            return nil
        } catch {
            return error
        }
    }

    /// Lower-case hex of bytes (digests compared with ones computed elsewhere).
    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    /// Base64url without padding (JWT parts).
    static func base64URL(_ bytes: some Sequence<UInt8>) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
