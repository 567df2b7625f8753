import Foundation
import Testing

@testable import CapGate

/// SPEC §13: several named operator tokens (`operator.tokens`), compared in constant time; the
/// unnamed `operator.token` is `operator`; SPEC §7: none shorter than 32 characters. The audit
/// reads' query checks.
@Suite("Operator tokens and audit queries", .timeLimit(.minutes(1)))
struct OperatorTokenTests {
    static let ci = "ci-" + String(repeating: "a", count: 30)
    static let deploy = "deploy-" + String(repeating: "b", count: 30)

    @Test("operator.tokens parses name:token pairs (SPEC §7) or a JSON list of {name, token}; a bad list names the key")
    func parse() throws {
        let expected = [OperatorToken(name: "ci", token: Self.ci), OperatorToken(name: "deploy", token: Self.deploy)]
        #expect(try OperatorToken.parse("ci:\(Self.ci),deploy:\(Self.deploy)") == expected)
        #expect(try OperatorToken.parse(" ci:\(Self.ci) , deploy:\(Self.deploy) ") == expected)
        #expect(try OperatorToken.parse("ops:s3cret:with:colons") == [OperatorToken(name: "ops", token: "s3cret:with:colons")])
        #expect(try OperatorToken.parse("a:x") == [OperatorToken(name: "a", token: "x")])
        let json = #"[{"name": "ci", "token": "\#(Self.ci)"}, {"token": "\#(Self.deploy)", "name": "deploy"}]"#
        #expect(try OperatorToken.parse(json) == expected)
        #expect(try OperatorToken.parse("[]") == [])
        #expect(try OperatorToken.parse("") == [])
        for bad in [
            "ci=\(Self.ci)", "ci:", ":\(Self.ci)", "ci:\(Self.ci),", "ci:\(Self.ci),,deploy:\(Self.deploy)", "CI!:\(Self.ci)",
            "ci:\(Self.ci),ci:\(Self.deploy)", "ci:\(Self.ci),other:\(Self.ci)", "ci:has a space",
            #"{"name": "ci", "token": "\#(Self.ci)"}"#, #"[{"name": "ci"}]"#, #"[{"name": "CI!", "token": "\#(Self.ci)"}]"#,
            #"[{"name": "ci", "token": "\#(Self.ci)"}, {"name": "ci", "token": "\#(Self.deploy)"}]"#,
            #"[{"name": "ci", "token": "\#(Self.ci)", "extra": 1}]"#, #"[{"name": "ci", "token": "has a space in it!!"}]"#,
        ] {
            #expect(throws: ConfigurationError.self, "\(bad)") { try OperatorToken.parse(bad) }
        }
    }

    @Test("match finds the token presented, whichever of several, and nothing for a near miss")
    func match() {
        let tokens = [OperatorToken(name: "operator", token: "op-" + Self.ci), OperatorToken(name: "ci", token: Self.ci)]
        #expect(OperatorToken.match(Self.ci, in: tokens)?.name == "ci")
        #expect(OperatorToken.match("op-" + Self.ci, in: tokens)?.name == "operator")
        #expect(OperatorToken.match(Self.ci + "x", in: tokens) == nil)
        #expect(OperatorToken.match("", in: tokens) == nil)
        #expect(OperatorToken.match(Self.ci, in: []) == nil)
    }

    @Test("configuration: operator.token is 'operator', operator.tokens adds named ones; a repeated token or name is refused")
    func configuration() async throws {
        let list = "ci:\(Self.ci)"
        let both = try await CapGateConfiguration.load(
            flags: ["operator.token": "op-" + Self.deploy], environment: ["OPERATOR_TOKENS": list], file: "/nonexistent.json")
        #expect(both.operators.all.map(\.name) == ["operator", "ci"])
        let onlyNamed = try await CapGateConfiguration.load(environment: ["OPERATOR_TOKENS": list], file: "/nonexistent.json")
        #expect(onlyNamed.operators.all == [OperatorToken(name: "ci", token: Self.ci)])
        await #expect(throws: ConfigurationError.self) {
            try await CapGateConfiguration.load(
                flags: ["operator.token": Self.ci], environment: ["OPERATOR_TOKENS": list], file: "/nonexistent.json")
        }
        await #expect(throws: ConfigurationError.self) {
            try await CapGateConfiguration.load(
                environment: ["OPERATOR_TOKENS": #"[{"name": "operator", "token": "\#(Self.deploy)"}]"#, "OPERATOR_TOKEN": Self.ci],
                file: "/nonexistent.json")
        }
    }

    @Test(
        "an operator token under 32 characters stops the start, naming the key (and a listed token's name), never the token, worded as jwt.secret's"
    )
    func minimumLength() async throws {
        let short = "s3cret-" + String(repeating: "z", count: 24)  // 31 characters
        #expect(short.count == 31)
        let exact = short + "z"
        func refusal(flags: [String: String] = [:], environment: [String: String] = [:]) async -> String? {
            do {
                _ = try await CapGateConfiguration.load(flags: flags, environment: environment, file: "/nonexistent.json")
                return nil
            } catch {
                return "\(error)"
            }
        }
        let single = await refusal(environment: ["OPERATOR_TOKEN": short])
        #expect(
            single
                == "configuration error: operator.token (OPERATOR_TOKEN) is 31 characters long; an operator token must be at least 32 characters"
        )
        #expect(await refusal(flags: ["operator.token": short]) == single)
        let listed = await refusal(environment: ["OPERATOR_TOKENS": "deploy:\(Self.deploy),ci:\(short)"])
        #expect(
            listed
                == "configuration error: operator.tokens (OPERATOR_TOKENS) has the token named 'ci' 31 characters long; an operator token must be at least 32 characters"
        )
        let listedJSON = await refusal(environment: ["OPERATOR_TOKENS": #"[{"name": "ci", "token": "\#(short)"}]"#])
        #expect(listedJSON == listed)
        // A 6-character token, as the review found accepted: refused the same way.
        #expect(await refusal(environment: ["OPERATOR_TOKEN": "op-abc"])?.contains("is 6 characters long") == true)
        for message in [single, listed, listedJSON] { #expect(message?.contains(short) == false) }
        // jwt.secret's refusal, for the wording the two share.
        let jwt = await refusal(environment: ["JWT_SECRET": short])
        #expect(jwt == "configuration error: jwt.secret (JWT_SECRET) is 31 bytes long; an HS256 secret must be at least 32 bytes")
        // 32 characters is enough, for either key.
        #expect(await refusal(environment: ["OPERATOR_TOKEN": exact, "OPERATOR_TOKENS": "ci:\(exact)-ci"]) == nil)
        // Characters, not bytes: 32 accented letters are 64 bytes and pass; 31 of them do not.
        #expect(await refusal(environment: ["OPERATOR_TOKEN": String(repeating: "é", count: 32)]) == nil)
        #expect(await refusal(environment: ["OPERATOR_TOKEN": String(repeating: "é", count: 31)]) != nil)
    }

    @Test("audit action names: two lower-case words joined by a dot")
    func actions() {
        for good in ["user.create", "api_key.revoke", "price_book.replace"] { #expect(AuditRoutes.isAction(good)) }
        for bad in ["", "user", "user.", ".create", "User.create", "user.create.x", "user create", "user.cr3ate"] {
            #expect(!AuditRoutes.isAction(bad), "\(bad)")
        }
    }
}
