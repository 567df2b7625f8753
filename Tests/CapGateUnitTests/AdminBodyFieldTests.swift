import Foundation
import Testing

@testable import CapGate

/// Admin and operator bodies read field by field (Admin/BodyFields.swift): SPEC §5's snake_case
/// fields, caps as integers or `null` (unlimited), absent keeping the current value, and a 400
/// that names the field for anything else.
@Suite("Admin body fields")
struct AdminBodyFieldTests {
    static func body(_ fields: KeyValuePairs<String, JSON>, nul: Bool = false) -> BodyFields {
        BodyFields(fields: Dictionary(fields.map { ($0.key, $0.value) }, uniquingKeysWith: { a, _ in a }), containsNUL: nul)
    }

    @Test("a cap: absent, null (unlimited) or a whole number from 0 to 10^15, 5.0 read as 5")
    func caps() throws {
        let body = Self.body(["zero": 0, "five": 5.0, "max": .int(BodyFields.maxCap), "none": .null])
        let nine: Int64? = 9
        let unlimited: Int64? = nil
        #expect(try body.cap("zero", keeping: nine) == 0)
        #expect(try body.cap("five", keeping: unlimited) == 5)
        #expect(try body.cap("max", keeping: unlimited) == 1_000_000_000_000_000)
        #expect(try body.cap("none", keeping: nine) == nil)
        #expect(try body.cap("missing", keeping: nine) == 9)
        #expect(try body.cap("missing", keeping: unlimited) == nil)
        #expect(try body.cap("monthly_user_cap", keeping: .obj(["monthly_user_cap": 25])) == 25)
    }

    @Test("a role: member or admin exactly; absent or null is nil; any other text, case, padding or type is 400 naming the field")
    func roles() throws {
        #expect(try Self.body(["role": "member"]).role("role") == .member)
        #expect(try Self.body(["role": "admin"]).role("role") == .admin)
        #expect(try Self.body([:]).role("role") == nil)
        #expect(try Self.body(["role": .null]).role("role") == nil, "null is absent: the default, or unchanged")
        let values: [JSON] = ["owner", "Admin", "admin ", "", "superadministrator", 1, true, .array(["admin"])]
        for value in values {
            let body = Self.body(["role": value])
            #expect(UnitTestSupport.refusalMessage { _ = try body.role("role") } != nil, "\(value) accepted")
        }
        #expect(
            UnitTestSupport.refusalMessage { _ = try Self.body(["role": "owner"]).role("role") } == "'role' must be 'member' or 'admin'.")
    }

    @Test("a cap that is negative, over 10^15, fractional, a string or a bool is 400 naming the field")
    func capRefusals() {
        let values: [JSON] = [-1, .int(BodyFields.maxCap + 1), 2.5, "10", true, .array([1]), .obj([:])]
        for value in values {
            let body = Self.body(["monthly_company_cap": value])
            #expect(
                UnitTestSupport.refusalMessage { _ = try body.cap("monthly_company_cap") }
                    == "'monthly_company_cap' must be a whole number from 0 to 1000000000000000, or null for unlimited.", "\(value)")
        }
    }

    @Test("rate limits (SPEC §14): each of the five kept when absent, null for none, bounded by its own maximum")
    func rateLimits() throws {
        let current = RateState.Limits(companyRPM: 100, companyTPM: 5_000, userRPM: 10, userTPM: nil, userConcurrency: 2)
        let body = Self.body(["user_rpm": .null, "user_tpm": 1_000_000_000_000, "user_concurrency": 0])
        #expect(
            try body.rateLimits(keeping: current)
                == RateState.Limits(companyRPM: 100, companyTPM: 5_000, userRPM: nil, userTPM: 1_000_000_000_000, userConcurrency: 0))
        for (key, over) in [("company_rpm", 1_000_000_001), ("user_tpm", 1_000_000_000_001), ("user_concurrency", 1_000_001)] {
            let message = UnitTestSupport.refusalMessage { _ = try Self.body([key: .int(Int64(over))]).rateLimits(keeping: current) }
            #expect(message?.hasPrefix("'\(key)' must be a whole number from 0 to ") == true, "\(key)")
        }
        #expect(UnitTestSupport.refusalMessage { _ = try Self.body(["company_rpm": -1]).rateLimits(keeping: current) } != nil)
    }

    @Test("strings: required names the field, a non-string or an empty one is refused, the length counted in characters")
    func strings() throws {
        let body = Self.body(["name": "Low Use", "empty": "", "number": 3, "long": .string(String(repeating: "é", count: 200))])
        #expect(try body.string("name") == "Low Use")
        #expect(try body.string("missing") == nil)
        #expect(try body.string("long") == String(repeating: "é", count: 200))
        #expect(UnitTestSupport.refusalMessage { _ = try body.requiredString("missing") } == "'missing' is required.")
        #expect(UnitTestSupport.refusalMessage { _ = try body.string("number") } == "'number' must be a string.")
        #expect(UnitTestSupport.refusalMessage { _ = try body.string("empty") } == "'empty' must be 1 to 200 characters.")
        #expect(UnitTestSupport.refusalMessage { _ = try body.string("long", maxLength: 199) } == "'long' must be 1 to 199 characters.")
    }

    @Test("NUL (PostgreSQL text cannot hold it) is refused in a field that is read, and only when the body held one")
    func nul() throws {
        let body = Self.body(["name": "a\u{0}b"], nul: true)
        #expect(UnitTestSupport.refusalMessage { _ = try body.string("name") } == "'name' must not contain NUL (\\u0000) characters.")
        #expect(Array("{\"a\":\"\\u0000\"}".utf8).containsSequence(Array("\\u0000".utf8)))
        #expect(Array("{\"a\":\"\\U0000\"}".utf8).containsSequence(Array("\\u0000".utf8)))
        #expect(!Array("{\"a\":\"\\u0001\"}".utf8).containsSequence(Array("\\u0000".utf8)))
        #expect(![UInt8]().containsSequence([0x61]))
    }

    @Test("money (a price): a number or numeric string, at most 2 decimals and 10 whole digits, read exactly")
    func money() throws {
        let cases: [(String, Decimal)] = [
            ("19.99", Decimal(string: "19.99")!), ("0", 0), (".5", Decimal(string: "0.5")!), ("5.", 5),
            ("9999999999.99", Decimal(string: "9999999999.99")!),
        ]
        for (text, amount) in cases {
            #expect(BodyFields.money(text) == amount, "\(text)")
        }
        for text in ["", ".", "1.234", "12345678901", "-1", "1e3", " 1", "1,5", "1.2.3", "٣"] {
            #expect(BodyFields.money(text) == nil, "\(text)")
        }
        let body = Self.body(["price": 19.99, "int": 49, "text": "+12.5", "zero": 0.0, "bad": 1.999, "flag": true])
        #expect(try body.money("price") == Decimal(string: "19.99")! && body.money("int") == 49)
        #expect(try body.money("text") == Decimal(string: "12.5")! && body.money("zero") == 0 && body.money("none") == nil)
        for key in ["bad", "flag"] {
            #expect(
                UnitTestSupport.refusalMessage { _ = try body.money(key) }
                    == "'\(key)' must be a number from 0 to 9999999999.99 with at most 2 decimals.")
        }
    }

    @Test("feature id lists: duplicates dropped in order, empty only where allowed, at most 100, each a feature id")
    func featureIDs() throws {
        let body = Self.body([
            "features": .array(["analysis", "chat", "analysis"]), "empty": .array([]), "bad": .array(["Chat"]),
            "many": .array((0...100).map { JSON.string("f\($0)") }), "number": .array([1]), "none": .null,
        ])
        #expect(try body.featureIDs("features", allowEmpty: false) == ["analysis", "chat"])
        #expect(try body.featureIDs("empty", allowEmpty: true) == [])
        #expect(try body.featureIDs("none", allowEmpty: false) == nil)
        #expect(
            UnitTestSupport.refusalMessage { _ = try body.featureIDs("empty", allowEmpty: false) }
                == "'empty' must be a list of 1 to 100 feature ids, or null.")
        #expect(
            UnitTestSupport.refusalMessage { _ = try body.featureIDs("many", allowEmpty: true) }
                == "'many' must be a list of 0 to 100 feature ids, or null.")
        #expect(
            UnitTestSupport.refusalMessage { _ = try body.featureIDs("bad", allowEmpty: true) }?.hasSuffix(
                #"; "Chat" is not a feature id."#) == true)
        #expect(
            UnitTestSupport.refusalMessage { _ = try body.featureIDs("number", allowEmpty: true) }?.hasSuffix("; 1 is not a feature id.")
                == true)
    }

    @Test("booleans, bounded integers, UUIDs and times: null is absent, a wrong type or value is 400 naming the field")
    func scalars() throws {
        let body = Self.body([
            "on": true, "off": "false", "n": 7, "big": 70, "id": "6F1C2A7E-93D4-4A55-9C61-0F3E2B1D9A10", "nid": "6f1c",
            "at": "2026-11-01T00:00:00Z",
            "bad_at": "tomorrow", "nothing": .null,
        ])
        #expect(try body.bool("on") == true && body.bool("nothing") == nil)
        #expect(UnitTestSupport.refusalMessage { _ = try body.bool("off") } == "'off' must be true or false.")
        #expect(try body.int("n", range: 1...10) == 7 && body.int("nothing", range: 1...10) == nil)
        #expect(UnitTestSupport.refusalMessage { _ = try body.int("big", range: 1...10) } == "'big' must be a whole number from 1 to 10.")
        #expect(try body.uuid("id") == UUID(uuidString: "6f1c2a7e-93d4-4a55-9c61-0f3e2b1d9a10"))
        #expect(UnitTestSupport.refusalMessage { _ = try body.uuid("nid") } == "'nid' must be a UUID.")
        #expect(UnitTestSupport.refusalMessage { _ = try body.uuid("missing", required: true) } == "'missing' is required.")
        #expect(try body.date("at") == UnitTestSupport.time("2026-11-01T00:00:00Z"))
        #expect(UnitTestSupport.refusalMessage { _ = try body.date("bad_at") }?.hasPrefix("'bad_at' must be an ISO-8601 time") == true)
    }

    @Test("a resource id: the path's wins and a different body id is 400; a create takes the body's, checked, or a generated one")
    func resourceIDs() throws {
        let body = Self.body(["id": "pro"])
        func isSlug(_ id: String) -> Bool { id.allSatisfy { $0.isLowercase || $0 == "-" } }
        #expect(try body.resourceID(path: "pro", what: "plan", isValid: isSlug, rule: "a slug") == "pro")
        #expect(
            UnitTestSupport.refusalMessage { _ = try body.resourceID(path: "low", what: "plan", isValid: isSlug, rule: "a slug") }
                == "'id' in the body does not match the plan in the path.")
        #expect(try body.resourceID(path: nil, what: "plan", isValid: isSlug, rule: "a slug") == "pro")
        #expect(
            UnitTestSupport.refusalMessage {
                _ = try Self.body(["id": "Pro"]).resourceID(path: nil, what: "plan", isValid: isSlug, rule: "a slug")
            }
                == "'id' must be a slug.")
        #expect(
            UnitTestSupport.refusalMessage { _ = try Self.body([:]).resourceID(path: nil, what: "plan", isValid: isSlug, rule: "a slug") }
                == "'id' is required.")
        #expect(try Self.body([:]).resourceID(path: nil, what: "route", isValid: isSlug, rule: "a slug", generated: { "made" }) == "made")
    }
}
