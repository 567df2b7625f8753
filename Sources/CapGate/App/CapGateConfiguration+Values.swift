import Configuration
import Foundation
import SystemPackage

/// Reading one key's value, checked: the helpers every key of ``CapGateConfiguration`` goes through.
extension CapGateConfiguration {
    /// `notifications.thresholds`: a JSON array in the file, or `80,100` / `[80, 100]` as text.
    static func thresholds(_ reader: ConfigReader) throws -> [Int] {
        let problem = ConfigurationError(
            key: "notifications.thresholds", problem: "must be a list of whole percentages from 1 to 100, such as [80, 100]")
        var values: [Int]
        if let list = reader.intArray(forKey: "notifications.thresholds") {
            values = list
        } else if let text = reader.string(forKey: "notifications.thresholds") {
            let inner = text.trimmingCharacters(in: CharacterSet(charactersIn: "[] "))
            values = []
            for part in inner.split(separator: ",") {
                guard let value = Int(part.trimmingCharacters(in: .whitespaces)) else { throw problem }
                values.append(value)
            }
        } else {
            return [80, 100]
        }
        guard values.count <= 10, values.allSatisfy({ (1...100).contains($0) }) else { throw problem }
        return Array(Set(values)).sorted()
    }

    static func nonEmpty(_ s: String?) -> String? {
        guard let s, !s.isEmpty else { return nil }
        return s
    }

    static func int(_ reader: ConfigReader, _ key: String, default value: Int, range: ClosedRange<Int>) throws -> Int {
        if let int = reader.int(forKey: ConfigKey(key)) {
            guard range.contains(int) else {
                throw ConfigurationError(key: key, problem: "must be between \(range.lowerBound) and \(range.upperBound)")
            }
            return int
        }
        if let text = reader.string(forKey: ConfigKey(key)) {
            guard let int = Int(text), range.contains(int) else {
                throw ConfigurationError(key: key, problem: "must be a whole number between \(range.lowerBound) and \(range.upperBound)")
            }
            return int
        }
        return value
    }

    static func bool(_ reader: ConfigReader, _ key: String, default value: Bool) throws -> Bool {
        if let bool = reader.bool(forKey: ConfigKey(key)) { return bool }
        guard let text = reader.string(forKey: ConfigKey(key)) else { return value }
        switch text.lowercased() {
        case "true", "1", "yes": return true
        case "false", "0", "no": return false
        default: throw ConfigurationError(key: key, problem: "must be true or false")
        }
    }

    static func double(_ reader: ConfigReader, _ key: String, default value: Double) throws -> Double {
        if let d = reader.double(forKey: ConfigKey(key)) {
            guard d > 0 else { throw ConfigurationError(key: key, problem: "must be a positive number of seconds") }
            return d
        }
        if let i = reader.int(forKey: ConfigKey(key)) {
            guard i > 0 else { throw ConfigurationError(key: key, problem: "must be a positive number of seconds") }
            return Double(i)
        }
        if let text = reader.string(forKey: ConfigKey(key)) {
            guard let d = Double(text), d > 0 else {
                throw ConfigurationError(key: key, problem: "must be a positive number of seconds")
            }
            return d
        }
        return value
    }
}
