import CapGate
import Crypto
import Foundation
import PostgresNIO
import Testing

/// Issue #50 item 2: `capgate ledger export --month YYYY-MM --to FILE [--format jsonl|csv]`, run
/// as the real binary against a migrated database whose ledger rows were written with SQL.
@Suite("Ledger export", .timeLimit(.minutes(5)))
struct LedgerExportTests {
    static var binary: String { CommandTests.binary }
    static let companyA = "00000000-0000-4000-8000-00000000000a"
    static let companyB = "00000000-0000-4000-8000-00000000000b"
    static let user = "00000000-0000-4000-8000-0000000000ee"

    /// Every column of a ledger row, as SQL literals.
    static let allColumns =
        "company_id, period_id, user_id, units, input_tokens, output_tokens, method, route, model, feature, request_id, "
        + "idempotency_key, outcome, upstream_status, created_at, settled_at, feature_day, cache_write_5m_tokens, "
        + "cache_write_1h_tokens, cache_read_tokens, hold_micros, cost_micros, cost_source, rate_minute, rate_tokens, "
        + "rate_scopes, units_grant_id, cost_grant_id, units_grant_part, cost_grant_part"

    /// A row with every nullable column NULL, created at `at`.
    static func bare(_ company: String, _ at: String, request: String) -> String {
        "('\(company)', 1, '\(user)', 1, NULL, NULL, 'POST', '/v1/messages', NULL, NULL, '\(request)', NULL, 'charged', NULL, "
            + "'\(at)', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    }

    /// A row with every column set, text that needs quoting and escaping in `route` and `model`.
    static func full(_ company: String, _ at: String, request: String, idempotencyKey: String) -> String {
        "('\(company)', 2, '\(user)', 3, 1200, 345, 'POST', E'/v1/a,b \"q\"\\nline 模型', E'claude-é, \"x\"\\r\\nz', 'chat', "
            + "'\(request)', '\(idempotencyKey)', 'refunded', 529, '\(at)', '\(at)'::timestamptz + interval '1.5 seconds', "
            + "'2026-01-15T00:00:00Z', 10, 11, 12, 5000000, 4123456, 'usage', '2026-01-15T12:00:00Z', 2000, 31, 77, 78, 1, 2)"
    }

    /// Three months of rows, boundaries included: 2025-12's last instant, 2026-01's first and
    /// last, 2026-02's first. Returns the request ids of January's rows in the order expected.
    static func seed(_ client: PostgresClient) async throws -> [String] {
        let rows = [
            bare(companyA, "2025-12-31T23:59:59.999999Z", request: "dec-last"),
            bare(companyB, "2026-01-01T00:00:00Z", request: "jan-first"),
            full(companyB, "2026-01-15T12:00:00.123456Z", request: "jan-mid-b", idempotencyKey: ""),
            full(companyA, "2026-01-15T12:00:00.123456Z", request: "jan-mid-a", idempotencyKey: "key,1"),
            bare(companyA, "2026-01-31T23:59:59.999999Z", request: "jan-last"),
            bare(companyA, "2026-02-01T00:00:00Z", request: "feb-first"),
            full(companyA, "2026-02-10T08:00:00Z", request: "feb-mid", idempotencyKey: "k"),
        ]
        try await exec(client, "INSERT INTO usage_ledger (\(allColumns)) VALUES " + rows.joined(separator: ",\n"))
        return ["jan-first", "jan-mid-a", "jan-mid-b", "jan-last"]
    }

    static func exec(_ client: PostgresClient, _ sql: String) async throws {
        _ = try await client.query(PostgresQuery(unsafeSQL: sql), logger: TestCluster.logger).collect()
    }

    static func strings(_ client: PostgresClient, _ sql: String) async throws -> [String] {
        try await client.query(PostgresQuery(unsafeSQL: sql), logger: TestCluster.logger).decode(String.self).collect()
    }

    /// A fresh migrated database and a client on it.
    static func withDatabase(_ body: @escaping @Sendable (DatabaseURL, PostgresClient) async throws -> Void) async throws {
        try #require(FileManager.default.isExecutableFile(atPath: binary), "build the binary first: swift build")
        let url = try await TestCluster.freshDatabase()
        try await CapGateRunner.withClient(url: url, logger: TestCluster.logger) { try await body(url, $0) }
    }

    static func withFolder(_ body: (String) async throws -> Void) async throws {
        let folder = NSTemporaryDirectory() + "ledger-export-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try await body(folder)
    }

    /// `capgate ledger export` as the real binary: its exit status and output.
    static func export(_ url: DatabaseURL, _ arguments: [String]) async throws -> (Int32, String) {
        try await SDKTests.run(binary, ["ledger", "export"] + arguments, environment: ["DATABASE_URL": url.text])
    }

    static func sha256(of path: String) throws -> String { try digest(of: path).sha256 }

    /// The SHA-256 of a file and how many line feeds it holds, read 1 MiB at a time.
    static func digest(of path: String) throws -> (sha256: String, lines: Int) {
        let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var hasher = SHA256()
        var lines = 0
        while let chunk = try handle.read(upToCount: 1 << 20), !chunk.isEmpty {
            hasher.update(data: chunk)
            lines += chunk.reduce(0) { $0 + ($1 == 0x0a ? 1 : 0) }
        }
        return (hasher.finalize().map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined(), lines)
    }

    /// Exports `month` to `file` twice (the second to `file` + `.again`): both succeed, print
    /// their line, give the same bytes, and `sha256sum -c` accepts each checksum file.
    static func exportTwice(_ url: DatabaseURL, month: String, file: String, format: String, rows: Int) async throws {
        for path in [file, file + ".again"] {
            let (status, output) = try await export(url, ["--month", month, "--to", path, "--format", format])
            #expect(status == 0, "\(output)")
            let sha = try sha256(of: path)
            #expect(output == "exported \(rows) rows of \(month) to \(path), sha256 \(sha)\n")
            let name = URL(fileURLWithPath: path).lastPathComponent
            #expect(try String(contentsOfFile: path + ".sha256", encoding: .utf8) == "\(sha)  \(name)\n")
            let (checked, checkOutput) = try await SDKTests.run(
                URL(fileURLWithPath: "/usr/bin/sha256sum"), ["-c", name + ".sha256"], environment: [:],
                folder: URL(fileURLWithPath: path).deletingLastPathComponent())
            #expect(checked == 0 && checkOutput == "\(name): OK\n", "\(checkOutput)")
            #expect(!FileManager.default.fileExists(atPath: path + ".partial"))
        }
        let first = try Data(contentsOf: URL(fileURLWithPath: file))
        #expect(first == (try Data(contentsOf: URL(fileURLWithPath: file + ".again"))))
    }

    @Test("a month in both formats: exactly its rows, boundaries in the later month, the same bytes twice, read back equal")
    func exportsTheMonth() async throws {
        try await Self.withDatabase { url, client in
            let expected = try await Self.seed(client)
            try await Self.withFolder { folder in
                try await Self.exportTwice(url, month: "2026-01", file: folder + "/jan.jsonl", format: "jsonl", rows: 4)
                try await Self.exportTwice(url, month: "2026-01", file: folder + "/jan.csv", format: "csv", rows: 4)
                try await Self.compareWithDatabase(client, folder: folder, expected: expected)
                let csv = try String(contentsOfFile: folder + "/jan.csv", encoding: .utf8)
                // The empty Idempotency-Key is "" and a NULL is an empty field; records end in CRLF.
                #expect(csv.contains(",jan-mid-b,\"\",refunded,529,"))
                #expect(csv.contains(",jan-first,,charged,,2026-01-01T00:00:00.000000Z,,,"))
                #expect(csv.hasSuffix("\r\n") && csv.hasPrefix("company_id,id,period_id,user_id,units,"))

                let recorded = try await Self.strings(
                    client,
                    "SELECT month::text || ' ' || format || ' ' || rows || ' ' || bytes || ' ' || sha256 || ' ' || path "
                        + "FROM ledger_exports ORDER BY format")
                #expect(
                    recorded == [
                        "2026-01-01 csv 4 \(try Self.size(folder + "/jan.csv")) \(try Self.sha256(of: folder + "/jan.csv")) "
                            + "\(folder)/jan.csv.again",
                        "2026-01-01 jsonl 4 \(try Self.size(folder + "/jan.jsonl")) \(try Self.sha256(of: folder + "/jan.jsonl")) "
                            + "\(folder)/jan.jsonl.again",
                    ])
            }
        }
    }

    static func size(_ path: String) throws -> Int64 {
        (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value ?? -1
    }

    /// Python's `json` and `csv` modules read the two files back; every row must equal the
    /// database's (`to_jsonb` of the row, timestamps compared as instants), in the expected order,
    /// with the columns in the table's order and every timestamp written as RFC 3339 UTC with
    /// microseconds.
    static func compareWithDatabase(_ client: PostgresClient, folder: String, expected: [String]) async throws {
        let database = try await strings(
            client,
            """
            SELECT to_jsonb(l)::text FROM usage_ledger l
             WHERE request_id IN (\(expected.map { "'\($0)'" }.joined(separator: ",")))
             ORDER BY array_position(ARRAY[\(expected.map { "'\($0)'" }.joined(separator: ","))], request_id)
            """)
        let columns = try await strings(
            client,
            """
            SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = 'usage_ledger' ORDER BY ordinal_position
            """)
        try (database.joined(separator: "\n") + "\n").write(toFile: folder + "/db.jsonl", atomically: true, encoding: .utf8)
        try (columns.joined(separator: "\n") + "\n").write(toFile: folder + "/columns.txt", atomically: true, encoding: .utf8)
        let (status, output) = try await SDKTests.run("python3", ["-c", Self.readBack, folder])
        #expect(status == 0 && output == "ok 4 rows, 31 columns\n", "\(output)")
    }

    static let readBack = #"""
        import csv, json, re, sys
        from datetime import datetime
        folder = sys.argv[1]
        columns = open(folder + "/columns.txt").read().split()
        db = [json.loads(line) for line in open(folder + "/db.jsonl", encoding="utf-8")]
        exported = [json.loads(line) for line in open(folder + "/jan.jsonl", encoding="utf-8", newline="")]
        with open(folder + "/jan.csv", encoding="utf-8", newline="") as f:
            table = list(csv.reader(f))
        assert table[0] == columns, table[0]
        stamp = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
        timestamps = {"created_at", "settled_at", "feature_day", "rate_minute"}
        assert len(db) == len(exported) == len(table) - 1, (len(db), len(exported), len(table))
        for want, got, record in zip(db, exported, table[1:]):
            assert list(got.keys()) == columns, list(got.keys())
            assert len(record) == len(columns)
            for name, cell in zip(columns, record):
                value, mine = want[name], got[name]
                if value is None:
                    assert mine is None and cell == "", (name, mine, cell)
                elif name in timestamps:
                    assert stamp.match(mine) and cell == mine, (name, mine, cell)
                    assert datetime.fromisoformat(mine) == datetime.fromisoformat(value), (name, mine, value)
                else:
                    assert mine == value and type(mine) == type(value), (name, mine, value)
                    assert cell == str(value), (name, cell, value)
        print(f"ok {len(db)} rows, {len(columns)} columns")
        """#

    @Test("refused with exit 2 and one line, nothing written: a file that exists, a malformed month, the month not over")
    func refusals() async throws {
        try await Self.withDatabase { url, client in
            _ = try await Self.seed(client)
            try await Self.withFolder { folder in
                let existing = folder + "/taken.jsonl"
                try Data("mine\n".utf8).write(to: URL(fileURLWithPath: existing))
                let current = LedgerMonth(containing: Date()).description
                let cases: [([String], String)] = [
                    (["--month", "2026-01", "--to", existing], "refused: \(existing) exists; nothing was written\n"),
                    (["--month", "2026-13", "--to", folder + "/a.jsonl"], "refused: --month 2026-13 is not a month as YYYY-MM"),
                    (["--month", "2026-1", "--to", folder + "/a.jsonl", "--format", "csv"], "refused: --month 2026-1 is not"),
                    (["--month", current, "--to", folder + "/a.jsonl"], "refused: \(current) has not ended yet (UTC)"),
                    (["--month", "2999-01", "--to", folder + "/a.jsonl"], "refused: 2999-01 has not ended yet (UTC)"),
                    (["--month", "2026-01", "--to", folder + "/a.xml", "--format", "xml"], "refused: --format xml is not jsonl or csv\n"),
                ]
                for (arguments, line) in cases {
                    let (status, output) = try await Self.export(url, arguments)
                    #expect(status == 2, "\(arguments): \(output)")
                    #expect(output.hasPrefix(line) && output.filter { $0 == "\n" }.count == 1, "\(arguments): \(output)")
                }
                #expect(try FileManager.default.contentsOfDirectory(atPath: folder) == ["taken.jsonl"])
                #expect(try String(contentsOfFile: existing, encoding: .utf8) == "mine\n")
                #expect(try await Self.strings(client, "SELECT count(*)::text FROM ledger_exports") == ["0"])
            }
        }
    }

    @Test("100,000 rows stream in constant memory: the process's peak RSS is not driven by the month's size")
    func constantMemory() async throws {
        try await Self.withDatabase { url, client in
            // March: 10,000 rows; April: 100,000 rows (some 55 MB of JSON lines); each with a 400-byte model name.
            for (month, count) in [("2026-03", 10_000), ("2026-04", 100_000)] {
                try await Self.exec(
                    client,
                    """
                    INSERT INTO usage_ledger (company_id, period_id, user_id, units, input_tokens, output_tokens, method, route, model,
                                              request_id, outcome, upstream_status, created_at, settled_at)
                    SELECT '\(Self.companyA)', 1, '\(Self.user)', 1, g, g * 2, 'POST', '/v1/messages', repeat('m', 400),
                           'req_' || g, 'charged', 200, '\(month)-01T00:00:00Z'::timestamptz + g * interval '10 seconds',
                           '\(month)-01T00:00:00Z'::timestamptz + g * interval '10 seconds' + interval '1 second'
                      FROM generate_series(1, \(count)) g
                    """)
            }
            try await Self.withFolder { folder in
                var peaks: [Int] = []
                for (month, count) in [("2026-03", 10_000), ("2026-04", 100_000)] {
                    let file = folder + "/\(month).jsonl"
                    let (status, output) = try await SDKTests.run(
                        "/usr/bin/time",
                        ["-v", Self.binary, "ledger", "export", "--month", month, "--to", file],
                        environment: ["DATABASE_URL": url.text])
                    #expect(status == 0, "\(output)")
                    let (sha256, lines) = try Self.digest(of: file)
                    #expect(output.contains("exported \(count) rows of \(month) to \(file), sha256 \(sha256)\n"))
                    #expect(lines == count)
                    let peak = output.split(separator: "\n").first { $0.contains("Maximum resident set size (kbytes):") }
                    peaks.append(Int(peak?.split(separator: ":").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? -1)
                }
                #expect(peaks.allSatisfy { $0 > 0 }, "no peak RSS read: \(peaks)")
                #expect(peaks[1] * 2 < peaks[0] * 3, "peak RSS in KiB, 10k rows vs 100k rows: \(peaks)")
            }
        }
    }
}
