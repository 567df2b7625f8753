import CapGate
import CapGateDev
import Foundation
import NIOCore
import PostgresNIO
import Synchronization
import Testing

@Suite("Migrations, configuration and period math", .timeLimit(.minutes(5)))
struct FoundationTests {
    @Test("migrations apply once, in order; a second run does nothing; dry run lists and creates nothing; a changed file is an error")
    func migrations() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("m_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        #expect(
            try await CapGateRunner.migrate(url: url, dryRun: true, logger: logger) == [
                "would apply 0001_schema", "would apply 0002_admission", "would apply 0003_rollover",
                "would apply 0004_admission_batch", "would apply 0005_period_locks", "would apply 0006_settle_plans",
                "would apply 0007_admission_fast_path", "would apply 0008_admission_batch_one_function",
                "would apply 0009_replay_attempts", "would apply 0010_idempotency_and_renewal",
                "would apply 0011_features_and_routes", "would apply 0012_notifications", "would apply 0013_feature_binding",
                "would apply db/functions",
            ])
        // The dry run changed nothing, not even the bookkeeping table.
        let tables = try await CapGateRunner.withClient(url: url, logger: logger) { client in
            try await client.query("SELECT count(*)::int8 FROM pg_tables WHERE schemaname = 'public'", logger: logger).decode(Int64.self)
                .collect()
        }
        #expect(tables == [0])
        #expect(
            try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger) == [
                "applied 0001_schema", "applied 0002_admission", "applied 0003_rollover", "applied 0004_admission_batch",
                "applied 0005_period_locks", "applied 0006_settle_plans", "applied 0007_admission_fast_path",
                "applied 0008_admission_batch_one_function", "applied 0009_replay_attempts",
                "applied 0010_idempotency_and_renewal", "applied 0011_features_and_routes", "applied 0012_notifications",
                "applied 0013_feature_binding", "applied db/functions",
            ])
        #expect(try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger) == ["nothing to apply"])
        #expect(try await CapGateRunner.migrate(url: url, dryRun: true, logger: logger) == ["nothing to apply"])

        // A copy of the migrations with one file edited after it was applied.
        let folder = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let source = SDKTests.root.appendingPathComponent("db/migrations").path
        for name in try FileManager.default.contentsOfDirectory(atPath: source) where name.hasSuffix(".sql") {
            var text = try String(contentsOfFile: source + "/" + name, encoding: .utf8)
            if name.hasPrefix("0001") { text += "\n-- edited\n" }
            try text.write(toFile: folder + "/" + name, atomically: true, encoding: .utf8)
        }
        let edited = try Migrator(folder: folder)
        await #expect(throws: Migrator.MigrationError.self) {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await edited.migrate(client: client, logger: logger)
            }
        }
    }

    @Test(
        "db/functions: an edited file re-applies the set; a file removed takes its function away; a function file that fails changes nothing"
    )
    func functionFiles() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("f_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        // A copy of db/ whose functions are edited.
        let root = NSTemporaryDirectory() + "db-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let source = SDKTests.root.appendingPathComponent("db").path
        try FileManager.default.copyItem(atPath: source, toPath: root)
        func migrate() async throws -> [String] {
            let migrator = try Migrator(folder: root + "/migrations")
            return try await CapGateRunner.withClient(url: url, logger: logger) { try await migrator.migrate(client: $0, logger: logger) }
        }
        func scalar(_ sql: String) async throws -> String? {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String?.self).collect().first ?? nil
            }
        }
        #expect(try await migrate() == [])
        let probe = root + "/functions/capgate_probe.sql"
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT 'one' $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT capgate_probe()") == "one")
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT 'two' $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT capgate_probe()") == "two")
        #expect(try await migrate() == [])
        // A broken file: the whole set is rolled back, the old functions stay.
        try "CREATE FUNCTION capgate_probe() RETURNS text LANGUAGE sql AS $$ SELECT nope $$;".write(
            toFile: probe, atomically: true, encoding: .utf8)
        await #expect(throws: Migrator.MigrationError.self) { try await migrate() }
        #expect(try await scalar("SELECT capgate_probe()") == "two")
        #expect(
            try await scalar(
                "SELECT to_regprocedure('capgate_charge(uuid,uuid,integer,text,text,text,text,text,bigint,timestamptz,text[])')::text")
                != nil)
        try FileManager.default.removeItem(atPath: probe)
        #expect(try await migrate() == [FunctionSet.name])
        #expect(try await scalar("SELECT to_regprocedure('capgate_probe()')::text") == nil)
        #expect(
            try await scalar(
                "SELECT to_regprocedure('capgate_charge(uuid,uuid,integer,text,text,text,text,text,bigint,timestamptz,text[])')::text")
                != nil)
    }

    @Test(
        "withDeadline: a quick body's value or error passes through; a slow body is answered at the limit, even one that ignores cancellation, and its late outcome is reported"
    )
    func deadline() async throws {
        struct Refused: Error {}
        #expect(try await withDeadline(.seconds(5)) { 42 } == 42)
        await #expect(throws: Refused.self) { try await withDeadline(.seconds(5)) { () async throws -> Int in throw Refused() } }
        let start = ContinuousClock.now
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(100)) { () async throws -> Int in
                try await Task.sleep(for: .seconds(30))
                return 1
            }
        }
        let waited = ContinuousClock.now - start
        #expect(waited >= .milliseconds(100) && waited < .seconds(5))

        // A body that ignores cancellation (as a PostgresNIO query in progress does): the caller
        // is answered at the limit, the body runs on, and its outcome reaches lateResult.
        let gate = Gate()
        let stubborn: @Sendable () async throws -> Int = {
            await withCheckedContinuation { gate.wait($0) }
            return 7
        }
        let (lateResults, late) = AsyncStream.makeStream(of: Result<Int, any Error>.self)
        let abandoned = ContinuousClock.now
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(100), lateResult: { late.yield($0) }, stubborn)
        }
        #expect(ContinuousClock.now - abandoned < .seconds(5))
        gate.open()
        var lateIterator = lateResults.makeAsyncIterator()
        #expect(try await lateIterator.next()?.get() == 7)

        // In time, lateResult is not called.
        let (onTimeResults, onTime) = AsyncStream.makeStream(of: Result<Int, any Error>.self)
        #expect(try await withDeadline(.seconds(5), lateResult: { onTime.yield($0) }) { 42 } == 42)
        onTime.finish()
        var onTimeIterator = onTimeResults.makeAsyncIterator()
        #expect(await onTimeIterator.next() == nil)
    }

    /// A wait that cancellation does not end: only ``open()`` does.
    final class Gate: Sendable {
        private let state = Mutex<(open: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

        func wait(_ continuation: CheckedContinuation<Void, Never>) {
            let open = state.withLock { state -> Bool in
                if !state.open { state.waiter = continuation }
                return state.open
            }
            if open { continuation.resume() }
        }

        func open() {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.open = true
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }
    }

    @Test("a cluster folder the postgres user cannot reach (a mode-700 checkout run as root) still gets a working cluster")
    func unreachableFolder() async throws {
        let root = NSTemporaryDirectory() + "capgate-private-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: root) }
        let cluster = try await offPool {
            try EmbeddedPostgres.start(directory: root + "/pg", settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: URL(fileURLWithPath: cluster.dataDirectory).deletingLastPathComponent().path)
        }
        let lines = try await CapGateRunner.migrate(url: cluster.url, dryRun: true, logger: TestCluster.logger)
        #expect(lines.first == "would apply 0001_schema")
    }

    @Test("two migrators at once: each file applied exactly once")
    func concurrentMigrate() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("m_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        async let a = CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        async let b = CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        let lines = try await a + b
        #expect(lines.filter { $0.hasPrefix("applied") }.count == Migrator().migrations.count + 1)
        #expect(lines.filter { $0 == "nothing to apply" }.count == 1)
    }

    @Test("configuration: flags over environment over the JSON file over defaults")
    func precedence() async throws {
        let file = NSTemporaryDirectory() + "capgate-\(UUID().uuidString).json"
        try #"{"http":{"host":"0.0.0.0","port":9000},"proxy":{"prefix":"/api/"},"upstream":{"url":"http://file.example"}}"#
            .write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let fromFile = try await CapGateConfiguration.load(environment: [:], file: file)
        #expect(fromFile.host == "0.0.0.0")
        #expect(fromFile.port == 9000)
        #expect(fromFile.proxyPrefix == "/api/")
        #expect(fromFile.jwtCompanyClaim == "company_id")
        #expect(fromFile.jwtFeatureClaim == "capgate_features")
        #expect(fromFile.billingRolloverInterval == 0)
        let fromEnv = try await CapGateConfiguration.load(
            environment: [
                "HTTP_PORT": "9100", "UPSTREAM_URL": "http://env.example", "UPSTREAM_API_KEY": "k", "PROXY_MAX_BODY_BYTES": "1234",
                "JWT_COMPANY_CLAIM": "org.id", "JWT_FEATURE_CLAIM": "org.features",
            ],
            file: file
        )
        #expect(fromEnv.port == 9100)
        #expect(fromEnv.host == "0.0.0.0")
        #expect(fromEnv.upstreamURL == "http://env.example")
        #expect(fromEnv.upstreamAPIKey == "k")
        #expect(fromEnv.proxyMaxBodyBytes == 1234)
        #expect(fromEnv.jwtCompanyClaim == "org.id")
        #expect(fromEnv.jwtFeatureClaim == "org.features")
        let fromFlags = try await CapGateConfiguration.load(flags: ["http.port": "9200"], environment: ["HTTP_PORT": "9100"], file: file)
        #expect(fromFlags.port == 9200)
        let defaults = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        #expect(defaults.host == "127.0.0.1")
        #expect(defaults.port == 8080)
        #expect(defaults.proxyPrefix == "/v1/")
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
        #expect(throws: ConfigurationError.self) { try configuration.require(configuration.databaseURL, key: "database.url") }
        #expect(ConfigurationError.environmentName(of: "upstream.apiKey") == "UPSTREAM_API_KEY")
        #expect(ConfigurationError.environmentName(of: "proxy.maxBodyBytes") == "PROXY_MAX_BODY_BYTES")
        #expect(ConfigurationError.environmentName(of: "billing.rolloverInterval") == "BILLING_ROLLOVER_INTERVAL")
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
        let utc = FoundationTests.date("2026-11-01T12:00:00Z")
        #expect(Timestamp.parse("2026-11-01T14:30:00+02:30") == utc)
        #expect(Timestamp.parse("2026-11-01T07:28:00-04:32") == utc)
        #expect(Timestamp.parse("2026-11-02T07:32:00+19:32") == utc)
        #expect(Timestamp.parse("2026-10-31T12:01:00-23:59") == utc)
        #expect(Timestamp.parse("2026-11-01T12:00:00.250Z") == utc.addingTimeInterval(0.25))
        #expect(Timestamp.parse("2026-11-01T17:30:00.5+05:30") == utc.addingTimeInterval(0.5))
        #expect(Timestamp.parse("2026-11-01") == FoundationTests.date("2026-11-01T00:00:00Z"))
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
