import Configuration
import Foundation

/// One operator bearer token and the name the audit log gives whoever presents it (SPEC §13).
/// Several (`operator.tokens`) let one be rotated without downtime: add the new one, move the
/// clients, remove the old one.
public struct OperatorToken: Sendable, Equatable {
    /// The unnamed `operator.token`'s name.
    public static let defaultName = "operator"
    /// The fewest characters an operator token may have (SPEC §7): a shorter one stops the start.
    /// The token is a full-admin credential that anyone who can reach the gateway may guess at.
    public static let minimumLength = 32

    public var name: String
    public var token: String

    public init(name: String, token: String) {
        self.name = name
        self.token = token
    }

    /// `operator.tokens` as text (SPEC §7: `name:token,name:token`, the form for the environment,
    /// `OPERATOR_TOKENS`, and the file), or a JSON array of `{"name", "token"}` objects. A name is
    /// 1 to 64 of `a-z 0-9 _ . -` and unique (it ends at the first `:`); a token is any text
    /// without whitespace or `,`, and appears once. An empty text is no tokens.
    public static func parse(_ text: String) throws(ConfigurationError) -> [OperatorToken] {
        let problem = ConfigurationError(
            key: "operator.tokens",
            problem:
                #"must be name:token pairs separated by commas, e.g. "ci:<token>,deploy:<token>" (or a JSON array of {"name": "...", "token": "..."} objects); names of a-z, 0-9, '_', '.', '-'; each name and token once"#
        )
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        let out = trimmed.hasPrefix("[") ? try parseJSON(trimmed, problem: problem) : try parsePairs(trimmed, problem: problem)
        try check(out, problem: problem)
        return out
    }

    /// `name:token,name:token`.
    private static func parsePairs(_ text: String, problem: ConfigurationError) throws(ConfigurationError) -> [OperatorToken] {
        guard !text.isEmpty else { return [] }
        var out: [OperatorToken] = []
        for pair in text.split(separator: ",", omittingEmptySubsequences: false) {
            let pair = pair.trimmingCharacters(in: .whitespaces)
            guard let colon = pair.firstIndex(of: ":") else { throw problem }
            out.append(OperatorToken(name: String(pair[..<colon]), token: String(pair[pair.index(after: colon)...])))
        }
        return out
    }

    /// `[{"name": "…", "token": "…"}, …]`.
    private static func parseJSON(_ text: String, problem: ConfigurationError) throws(ConfigurationError) -> [OperatorToken] {
        guard case .array(let items)? = try? JSON.parse(Array(text.utf8)) else { throw problem }
        var out: [OperatorToken] = []
        for item in items {
            guard case .object(let fields) = item, fields.count == 2, let name = item["name"]?.stringValue,
                let token = item["token"]?.stringValue
            else { throw problem }
            out.append(OperatorToken(name: name, token: token))
        }
        return out
    }

    /// Every token once, every name once and well formed.
    static func check(_ tokens: [OperatorToken], problem: ConfigurationError) throws(ConfigurationError) {
        let names = tokens.map(\.name)
        guard Set(names).count == names.count, Set(tokens.map(\.token)).count == tokens.count,
            tokens.allSatisfy({ isName($0.name) && !$0.token.isEmpty && !$0.token.contains(where: { $0.isWhitespace || $0 == "," }) })
        else { throw problem }
    }

    /// The refusal of a token shorter than ``minimumLength`` (worded as `jwt.secret`'s), naming
    /// the key and, for one of `operator.tokens`, the token's name; never the token. Nil when
    /// every token is long enough.
    static func lengthProblem(operatorToken: String?, operatorTokens: [OperatorToken]) -> ConfigurationError? {
        let rule = "an operator token must be at least \(minimumLength) characters"
        if let operatorToken, operatorToken.count < minimumLength {
            return ConfigurationError(key: "operator.token", problem: "is \(operatorToken.count) characters long; \(rule)")
        }
        if let short = operatorTokens.first(where: { $0.token.count < minimumLength }) {
            return ConfigurationError(
                key: "operator.tokens", problem: "has the token named '\(short.name)' \(short.token.count) characters long; \(rule)")
        }
        return nil
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

extension OperatorToken {
    /// `operator.token` and `operator.tokens`, each token and name once, every token long enough.
    static func configured(reader: ConfigReader) throws -> (token: String?, tokens: [OperatorToken]) {
        let operatorToken = CapGateConfiguration.nonEmpty(reader.string(forKey: "operator.token", isSecret: true))
        let operatorTokens = try CapGateConfiguration.nonEmpty(reader.string(forKey: "operator.tokens", isSecret: true)).map(parse) ?? []
        if let operatorToken {
            let all = [OperatorToken(name: defaultName, token: operatorToken)] + operatorTokens
            guard Set(all.map(\.name)).count == all.count, Set(all.map(\.token)).count == all.count else {
                throw ConfigurationError(
                    key: "operator.tokens", problem: "repeats operator.token or its name 'operator'; each token and name must appear once")
            }
        }
        // An operator token is a full-admin credential that anyone who can reach the gateway may
        // guess at: too short to guess stops the start, as a short jwt.secret does (SPEC §7).
        if let problem = lengthProblem(operatorToken: operatorToken, operatorTokens: operatorTokens) { throw problem }
        return (operatorToken, operatorTokens)
    }
}
