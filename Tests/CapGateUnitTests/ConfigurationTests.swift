import CapGate
import Foundation
import NIOCore
import Testing

@testable import CapGate

@Suite("Configuration and period math", .timeLimit(.minutes(1)))
struct ConfigurationTests {
    @Test("configuration: flags over environment over the JSON file over defaults")
    func precedence() async throws {
        let file = NSTemporaryDirectory() + "capgate-\(UUID().uuidString).json"
        try #"{"http":{"host":"0.0.0.0","port":9000},"proxy":{"prefix":"/api/"},"upstream":{"url":"http://file.example"}}"#
            .write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let fromFile = try await CapGateConfiguration.load(environment: [:], file: file)
        #expect(fromFile.http.host == "0.0.0.0")
        #expect(fromFile.http.port == 9000)
        #expect(fromFile.proxy.prefix == "/api/")
        #expect(fromFile.jwt.companyClaim == "company_id")
        #expect(fromFile.jwt.featureClaim == "capgate_features")
        #expect(fromFile.billingRolloverInterval == 0)
        let fromEnv = try await CapGateConfiguration.load(
            environment: [
                "HTTP_PORT": "9100", "UPSTREAM_URL": "http://env.example", "UPSTREAM_API_KEY": "k", "PROXY_MAX_BODY_BYTES": "1234",
                "JWT_COMPANY_CLAIM": "org.id", "JWT_FEATURE_CLAIM": "org.features",
            ],
            file: file
        )
        #expect(fromEnv.http.port == 9100)
        #expect(fromEnv.http.host == "0.0.0.0")
        #expect(fromEnv.upstream.url == "http://env.example")
        #expect(fromEnv.upstream.apiKey == "k")
        #expect(fromEnv.proxy.maxBodyBytes == 1234)
        #expect(fromEnv.jwt.companyClaim == "org.id")
        #expect(fromEnv.jwt.featureClaim == "org.features")
        let fromFlags = try await CapGateConfiguration.load(flags: ["http.port": "9200"], environment: ["HTTP_PORT": "9100"], file: file)
        #expect(fromFlags.http.port == 9200)
        let defaults = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        #expect(defaults.http.host == "127.0.0.1")
        #expect(defaults.http.port == 8080)
        #expect(defaults.proxy.prefix == "/v1/")
    }

    @Test("configuration errors name the key and its environment variable")
    func errors() async throws {
        do {
            _ = try await CapGateConfiguration.load(environment: ["HTTP_PORT": "eighty"], file: "/nonexistent.json")
            Issue.record("expected an error")
        } catch let error as ConfigurationError {
            #expect(error.description.contains("http.port (HTTP_PORT)"))
        }
        let configuration = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        #expect(throws: ConfigurationError.self) { try configuration.require(configuration.database.url, key: "database.url") }
        #expect(ConfigurationError.environmentName(of: "upstream.apiKey") == "UPSTREAM_API_KEY")
        #expect(ConfigurationError.environmentName(of: "proxy.maxBodyBytes") == "PROXY_MAX_BODY_BYTES")
        #expect(ConfigurationError.environmentName(of: "billing.rolloverInterval") == "BILLING_ROLLOVER_INTERVAL")
        // costs.toolOverheadTokens: a JSON object merged over the published figures, or a start refused naming it.
        let tools = try await CapGateConfiguration.load(
            environment: ["COSTS_TOOL_OVERHEAD_TOKENS": #"{"bash_20990101": 250}"#], file: "/nonexistent.json")
        #expect(tools.costs.toolOverheadTokens["bash_20990101"] == 250 && tools.costs.toolOverheadTokens["tool_choice"] == 346)
        #expect(configuration.costs.toolOverheadTokens == CostSettings.publishedToolOverhead)
        do {
            _ = try await CapGateConfiguration.load(
                environment: ["COSTS_TOOL_OVERHEAD_TOKENS": #"{"bash": -1}"#], file: "/nonexistent.json")
            Issue.record("expected an error")
        } catch let error as ConfigurationError {
            #expect(error.description.contains("costs.toolOverheadTokens (COSTS_TOOL_OVERHEAD_TOKENS)"))
        }
    }

    static func date(_ text: String) -> Date { Timestamp.parse(text)! }

    @Test("period k of an anchor is clamped to the month's last day, computed from the anchor")
    func periodMath() {
        let jan31 = Self.date("2026-01-31T10:00:00Z")
        #expect(PeriodMath.add(months: 1, to: jan31) == Self.date("2026-02-28T10:00:00Z"))
        #expect(PeriodMath.add(months: 2, to: jan31) == Self.date("2026-03-31T10:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.date("2028-01-31T10:00:00Z")) == Self.date("2028-02-29T10:00:00Z"))
        #expect(PeriodMath.add(months: 12, to: Self.date("2028-02-29T00:00:00Z")) == Self.date("2029-02-28T00:00:00Z"))
        #expect(PeriodMath.add(months: 48, to: Self.date("2028-02-29T00:00:00Z")) == Self.date("2032-02-29T00:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.date("2026-12-15T23:59:59Z")) == Self.date("2027-01-15T23:59:59Z"))
        #expect(PeriodMath.add(months: -1, to: Self.date("2026-03-31T00:00:00Z")) == Self.date("2026-02-28T00:00:00Z"))
        let p = PeriodMath.period(containing: Self.date("2026-03-01T00:00:00Z"), anchor: jan31, interval: .month)
        #expect(p.start == Self.date("2026-02-28T10:00:00Z"))
        #expect(p.end == Self.date("2026-03-31T10:00:00Z"))
        // The end instant belongs to the next period.
        let edge = PeriodMath.period(containing: Self.date("2026-03-31T10:00:00Z"), anchor: jan31, interval: .month)
        #expect(edge.start == Self.date("2026-03-31T10:00:00Z"))
        let yearly = PeriodMath.period(
            containing: Self.date("2027-06-01T00:00:00Z"), anchor: Self.date("2024-02-29T00:00:00Z"), interval: .year)
        #expect(yearly.start == Self.date("2027-02-28T00:00:00Z"))
        #expect(yearly.end == Self.date("2028-02-29T00:00:00Z"))
        // Every month of a year, for anchors on the 1st, 15th, 29th, 30th and 31st.
        for day in [1, 15, 29, 30, 31] {
            let anchor = Self.date(String(format: "2026-01-%02dT00:00:00Z", day))
            for k in 0..<24 {
                let (start, end) = PeriodMath.bounds(anchor: anchor, interval: .month, index: k)
                #expect(start < end)
                let inside = PeriodMath.period(containing: start.addingTimeInterval(1), anchor: anchor, interval: .month)
                #expect(inside.start == start && inside.end == end && inside.index == k)
                let parts = Calendar(identifier: .gregorian).dateComponents(in: TimeZone(identifier: "UTC")!, from: start)
                let days = Calendar(identifier: .gregorian).range(of: .day, in: .month, for: start)!.count
                #expect(parts.day == min(day, days))
            }
        }
    }
}

@Suite("JSON", .timeLimit(.minutes(5)))
struct JSONTests {
    @Test("times: RFC 3339 offsets up to ±23:59, fractions, a date alone; anything else is nil")
    func timestamps() {
        let utc = ConfigurationTests.date("2026-11-01T12:00:00Z")
        #expect(Timestamp.parse("2026-11-01T14:30:00+02:30") == utc)
        #expect(Timestamp.parse("2026-11-01T07:28:00-04:32") == utc)
        #expect(Timestamp.parse("2026-11-02T07:32:00+19:32") == utc)
        #expect(Timestamp.parse("2026-10-31T12:01:00-23:59") == utc)
        #expect(Timestamp.parse("2026-11-01T12:00:00.250Z") == utc.addingTimeInterval(0.25))
        #expect(Timestamp.parse("2026-11-01T17:30:00.5+05:30") == utc.addingTimeInterval(0.5))
        #expect(Timestamp.parse("2026-11-01") == ConfigurationTests.date("2026-11-01T00:00:00Z"))
        #expect(Timestamp.parse("2026-11-01t12:00:00z") == utc)
        #expect(Timestamp.parse("2026-11-01t14:00:00+02:00") == utc)
        for bad in [
            "2026-11-01T12:00:00+24:00", "2026-11-01T12:00:00+02:60", "2026-11-01T12:00:00+2:300", "2026-11-01T12:00:00Z+02:00",
            "yesterday", "", "+01:00",
        ] {
            #expect(Timestamp.parse(bad) == nil, "\(bad)")
        }
    }

    @Test("the parser reads what JSON allows and refuses what it does not")
    func parser() throws {
        let text = #"{"a":[1,-2.5e3,true,false,null,"x\"\u00e9\ud83d\ude00\n"],"b":{},"c":[],"d":0,"e":-0.5}"#
        let json = try JSON.parse(Array(text.utf8))
        #expect(json["a"]?.arrayValue?[0] == .int(1))
        #expect(json["a"]?.arrayValue?[1] == .double(-2500))
        #expect(json["a"]?.arrayValue?[5] == .string("x\"é😀\n"))
        #expect(json["b"] == .object([]))
        #expect(json["e"] == .double(-0.5))
        let reparsed = try JSON.parse(Array(json.serialized().utf8))
        #expect(reparsed["a"]?.arrayValue?[5] == json["a"]?.arrayValue?[5])
        #expect(reparsed["e"] == json["e"])
        for bad in ["", "{", "[1,]", "{\"a\":}", "01", "1.", "tru", "\"\u{01}\"", "{\"a\" 1}", "[1] 2", "\"\\ud800\""] {
            #expect(throws: (any Error).self, "\(bad)") { try JSON.parse(Array(bad.utf8)) }
        }
    }

    @Test("a top-level member is built past large nested values, which are only checked; a text that is not I-JSON gives nothing")
    func topLevelField() {
        func model(_ text: String) -> String? { JSON.topLevelValues(["model"], in: ByteBuffer(string: text))["model"]?.stringValue }
        let prompt = String(repeating: #"{"role":"user","content":[{"type":"text","text":"a \"quoted\" \\ model: x"}]},"#, count: 2_000)
        #expect(model(#"{"max_tokens":8,"messages":["# + prompt + #"{}],"model":"claude-x","stream":true}"#) == "claude-x")
        #expect(model(#" { "model" : "caf\u00e9" } "#) == "café")
        #expect(model(#"{"messages":[{"model":"nested"}],"metadata":{"model":"inner"}}"#) == nil)
        #expect(model(#"{"model":42}"#) == nil)
        #expect(model(#"["model","x"]"#) == nil)
        #expect(model(#"{"a":[1,2"#) == nil)
        #expect(model(#"{"a":"\u0001","model":"m"}"#) == "m")
        #expect(model("") == nil)
        let both = JSON.topLevelValues(
            ["model", "stream"], in: ByteBuffer(string: #"{"model":"m","messages":["# + prompt + #"{}],"stream":true}"#))
        #expect(both["model"]?.stringValue == "m" && both["stream"]?.boolValue == true)
        #expect(JSON.topLevelValues(["model", "stream"], in: ByteBuffer(string: #"{"model":"m"}"#)).keys.sorted() == ["model"])
        // A repeated name anywhere, or anything after the value, and nothing is taken.
        #expect(model(#"{"model":"first","model":"second"}"#) == nil)
        #expect(model(#"{"model":"m","x":{"a":1,"a":2}}"#) == nil)
        #expect(model(#"{"model":"m"} {"model":"n"}"#) == nil)
    }
}

@Suite("ledger.retentionMonths")
struct LedgerRetentionConfigurationTests {
    @Test("read and checked (1-1200): unset keeps every month; a set value is announced with what it drops; a bad one stops the start")
    func retentionMonths() async throws {
        let unset = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        #expect(unset.ledgerRetentionMonths == nil && unset.retentionNotice == nil)
        let set = try await CapGateConfiguration.load(environment: ["LEDGER_RETENTION_MONTHS": "24"], file: "/nonexistent.json")
        #expect(set.ledgerRetentionMonths == 24)
        #expect(set.retentionNotice?.contains("the 24 before it is dropped") == true && set.retentionNotice?.contains("exported") == true)
        for bad in ["0x1", "1201", "-3", "soon"] {
            await #expect(throws: ConfigurationError.self, "\(bad)") {
                try await CapGateConfiguration.load(environment: ["LEDGER_RETENTION_MONTHS": bad], file: "/nonexistent.json")
            }
        }
    }
}

/// The environment variable an error names for each key is the one docs/configuration.md (SPEC
/// §7's table) gives it, acronyms included (`proxy.maxJSONDepth` → `PROXY_MAX_JSON_DEPTH`).
@Suite("Configuration: the environment names errors give")
struct ConfigurationEnvironmentNameTests {
    @Test("every key of docs/configuration.md: the name a configuration error shows is the documented one")
    func documentedNames() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        var checked = 0
        for line in text.split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count > 1, cells[0].hasPrefix("`"), cells[1].hasPrefix("`") else { continue }
            let key = cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`"))
            let names = cells[1].split(separator: "/").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "` ")) }
            guard CapGateConfiguration.keys.contains(key) else { continue }
            #expect(names.contains(ConfigurationError.environmentName(of: key)), "\(key): \(names)")
            checked += 1
        }
        #expect(checked >= 40, "read \(checked) keys")
        #expect(ConfigurationError.environmentName(of: "proxy.maxJSONDepth") == "PROXY_MAX_JSON_DEPTH")
        #expect(ConfigurationError.environmentName(of: "apple.appAppleId") == "APPLE_APP_APPLE_ID")
        #expect(ConfigurationError.environmentName(of: "notifications.caFile") == "NOTIFICATIONS_CA_FILE")
    }

    @Test(
        "the keys are the parts' keys, each once; every secret key is a key; a secret's environment variables (its own name and the SPEC's) are read as secrets"
    )
    func partsKeys() async throws {
        let keys = CapGateConfiguration.keys
        #expect(Set(keys).count == keys.count, "a key listed twice")
        #expect(CapGateConfiguration.secretKeys.isSubset(of: Set(keys)))
        for key in CapGateConfiguration.secretKeys {
            #expect(key.hasSuffix("url") || key.contains("oken") || key.contains("ecret") || key.hasSuffix("apiKey"), "\(key)")
        }
        #expect(
            CapGateConfiguration.secretVariables == [
                "DATABASE_URL", "UPSTREAM_API_KEY", "OPERATOR_TOKEN", "OPERATOR_TOKENS", "JWT_SECRET", "NOTIFY_WEBHOOK_SECRET",
                "NOTIFICATIONS_WEBHOOK_SECRET", "METRICS_TOKEN",
            ])
    }
}
