import Foundation
import Testing

@testable import CapGate

/// `deploy/capgate.env`, the systemd unit's environment file: every configuration key is listed
/// with the variable CapGate really reads it from, and nothing else.
@Suite("deploy/capgate.env")
struct DeployEnvironmentFileTests {
    /// One entry of the file: the key its comment names, the variable below it, its example.
    struct Entry {
        let key: String
        let variable: String
        let example: String
    }

    static let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("deploy/capgate.env")

    /// `# key: meaning…` comment lines followed by `VARIABLE=value` (commented out or not).
    static func entries() throws -> [Entry] {
        var entries: [Entry] = []
        var key: String?
        for line in try String(contentsOf: file, encoding: .utf8).split(separator: "\n").map(String.init) {
            if let match = line.firstMatch(of: #/^\# ([a-zA-Z]+(?:\.[a-zA-Z]+)+): /#) {
                key = String(match.1)
            } else if let match = line.firstMatch(of: #/^#?([A-Z][A-Z0-9_]*)=(.*)$/#), let current = key {
                entries.append(Entry(key: current, variable: String(match.1), example: String(match.2)))
                key = nil
            }
        }
        return entries
    }

    @Test("every configuration key is in the file once, and no key the configuration does not read")
    func everyKey() throws {
        let listed = try Self.entries().map(\.key)
        #expect(listed.count == Set(listed).count, "a key listed twice")
        #expect(Set(listed) == Set(CapGateConfiguration.keys))
    }

    @Test("each variable is the one CapGate reads its key from (the environment alone, as the unit gives it)")
    func variablesAreRead() throws {
        let entries = try Self.entries()
        #expect(!entries.isEmpty)
        for entry in entries {
            let probe = "probe-\(entry.variable.lowercased())"
            #expect(
                CapGateConfiguration.environmentValue(forKey: entry.key, environment: [entry.variable: probe]) == probe,
                "\(entry.variable) does not set \(entry.key)")
        }
    }

    @Test("the examples given are valid values: every commented line uncommented, the configuration loads")
    func examplesLoad() async throws {
        var environment: [String: String] = [:]
        for entry in try Self.entries() where !entry.example.isEmpty {
            environment[entry.variable] = entry.example
        }
        let configuration = try await CapGateConfiguration.load(environment: environment, file: "/nonexistent.json")
        #expect(configuration.database.url == environment["DATABASE_URL"])
        #expect(configuration.spoolDirectory == "/var/lib/capgate/spool")
    }
}
