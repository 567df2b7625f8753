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

    /// The environment variable of a dotted key: `upstream.apiKey` → `UPSTREAM_API_KEY`.
    public static func environmentName(of key: String) -> String {
        var out = ""
        for part in key.split(separator: ".") {
            if !out.isEmpty { out += "_" }
            var previousLower = false
            for ch in part {
                if ch.isUppercase && previousLower { out += "_" }
                out += ch.uppercased()
                previousLower = ch.isLowercase
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
