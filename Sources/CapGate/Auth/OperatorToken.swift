import Foundation

/// One operator bearer token and the name the audit log gives whoever presents it (SPEC §13).
/// Several (`operator.tokens`) let one be rotated without downtime: add the new one, move the
/// clients, remove the old one.
public struct OperatorToken: Sendable, Equatable {
    /// The unnamed `operator.token`'s name.
    public static let defaultName = "operator"

    public var name: String
    public var token: String

    public init(name: String, token: String) {
        self.name = name
        self.token = token
    }

    /// `operator.tokens` as text: a JSON array of `{"name", "token"}` objects (the form for the
    /// environment, `OPERATOR_TOKENS`, and the file). Names are 1 to 64 of `a-z 0-9 _ . -` and
    /// unique; a token is at least 16 characters and appears once. nil for an empty text.
    public static func parse(_ text: String) throws(ConfigurationError) -> [OperatorToken] {
        let problem = ConfigurationError(
            key: "operator.tokens",
            problem:
                #"must be a JSON array of {"name": "...", "token": "..."} objects (names of a-z, 0-9, '_', '.', '-'; tokens of 16 characters or more, each once)"#
        )
        guard case .array(let items)? = try? JSON.parse(Array(text.utf8)) else { throw problem }
        var out: [OperatorToken] = []
        for item in items {
            guard case .object(let fields) = item, fields.count == 2, let name = item["name"]?.stringValue,
                let token = item["token"]?.stringValue
            else { throw problem }
            out.append(OperatorToken(name: name, token: token))
        }
        try check(out, problem: problem)
        return out
    }

    /// Every token once, every name once and well formed.
    static func check(_ tokens: [OperatorToken], problem: ConfigurationError) throws(ConfigurationError) {
        let names = tokens.map(\.name)
        guard Set(names).count == names.count, Set(tokens.map(\.token)).count == tokens.count,
            tokens.allSatisfy({ isName($0.name) && $0.token.count >= 16 && !$0.token.contains(where: \.isWhitespace) })
        else { throw problem }
    }

    static func isName(_ name: String) -> Bool {
        (1...64).contains(name.count)
            && name.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" || $0 == "." || $0 == "-"
            }
    }

    /// The operator token `candidate` matches, compared in constant time against every token
    /// (no early exit: the time taken does not tell which one, or whether any, matched).
    public static func match(_ candidate: String, in tokens: [OperatorToken]) -> OperatorToken? {
        var found: OperatorToken?
        for token in tokens where ApiKeyGenerator.constantTimeEquals(candidate, token.token) {
            if found == nil { found = token }
        }
        return found
    }
}
