import Configuration
import Foundation
import SystemPackage

/// A configuration problem, printed as one line naming the key and its environment variable.
public struct ConfigurationError: Error, CustomStringConvertible {
    public var key: String
    public var problem: String

    public init(key: String, problem: String) {
        self.key = key
        self.problem = problem
    }

    /// The environment variable SPEC §7 names for a dotted key: the name it gives apart
    /// (`notifications.webhookUrl` → `NOTIFY_WEBHOOK_URL`), else the key's own
    /// (``derivedEnvironmentName(of:)``). Both are read.
    public static func environmentName(of key: String) -> String {
        documentedNames[key] ?? derivedEnvironmentName(of: key)
    }

    /// The SPEC's own names, by key (``CapGateConfiguration/environmentAliases`` turned round).
    static let documentedNames: [String: String] = Dictionary(
        CapGateConfiguration.environmentAliases.map { ($0.value, $0.key) }, uniquingKeysWith: { min($0, $1) })

    /// The environment variable of a dotted key: `upstream.apiKey` → `UPSTREAM_API_KEY`, and an
    /// acronym is one word: `proxy.maxJSONDepth` → `PROXY_MAX_JSON_DEPTH`.
    public static func derivedEnvironmentName(of key: String) -> String {
        var out = ""
        for part in key.split(separator: ".") {
            if !out.isEmpty { out += "_" }
            let characters = Array(part)
            for (index, ch) in characters.enumerated() {
                // A word starts at a capital after a small letter (maxJ…), or at the capital
                // that begins a word after an acronym (…JSONDepth: before the D).
                if ch.isUppercase, index > 0 {
                    let previous = characters[index - 1]
                    let next = index + 1 < characters.count ? characters[index + 1] : nil
                    if previous.isLowercase || (previous.isUppercase && next?.isLowercase == true) { out += "_" }
                }
                out += ch.uppercased()
            }
        }
        return out
    }

    public var description: String {
        if key.contains(".") && !key.contains(" ") {
            return "configuration error: \(key) (\(Self.environmentName(of: key))) \(problem)"
        }
        return "configuration error: \(key) \(problem)"
    }
}
