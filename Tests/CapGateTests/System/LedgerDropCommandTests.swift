import CapGate
import Foundation
import PostgresNIO
import Testing

/// Issue #50 item 2: `capgate ledger drop --month YYYY-MM` as the real binary, beside
/// `capgate ledger export`, with `ledger.retentionMonths` from the environment: each refusal exits
/// 2 with its reason and changes nothing; an exported settled month goes, and `capgate verify`
/// exits 0 after.
@Suite("Ledger drop command", .timeLimit(.minutes(5)))
struct LedgerDropCommandTests {
    typealias P = LedgerPartitionTests

    static func run(_ url: DatabaseURL, _ arguments: [String], retention: String? = "1") async throws -> (Int32, String) {
        var environment = ["DATABASE_URL": url.text]
        if let retention { environment["LEDGER_RETENTION_MONTHS"] = retention }
        return try await SDKTests.run(CommandTests.binary, arguments, environment: environment)
    }

    @Test("refused with exit 2 and the reason (malformed, retention unset, within it, not exported), then dropped; verify exits 0")
    func dropCommand() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let url = try await TestCluster.freshDatabase()
        try await CapGateRunner.withClient(url: url, logger: TestCluster.logger) { client in
            let ids = try await LedgerRetentionTests.seed(client)
            try await LedgerRetentionTests.settledCall(client, ids, at: "2025-01-10T10:00:00Z")
            try await LedgerRetentionTests.settledCall(client, ids, at: "2025-02-10T10:00:00Z")
            let refusals: [([String], String?, String)] = [
                (["--month", "2025-1"], "1", "refused: --month 2025-1 is not a month as YYYY-MM"),
                (["--month", "2025-01"], nil, "refused: ledger.retentionMonths (LEDGER_RETENTION_MONTHS) is not set"),
                (["--month", "2025-01"], "1200", "refused: 2025-01 is within the retention (ledger.retentionMonths 1200"),
                (["--month", "2025-01"], "1", "refused: 2025-01 is not exported; run capgate ledger export --month 2025-01"),
            ]
            for (arguments, retention, expected) in refusals {
                let (status, output) = try await Self.run(url, ["ledger", "drop"] + arguments, retention: retention)
                #expect(status == 2 && output.contains(expected), "\(arguments) \(retention ?? "unset"): \(status) \(output)")
            }
            #expect(try await P.partitions(client).contains("usage_ledger_p202501"))

            try await LedgerRetentionTests.withFolder { folder in
                let (exported, exportOutput) = try await Self.run(
                    url, ["ledger", "export", "--month", "2025-01", "--to", folder + "/jan.jsonl"])
                #expect(exported == 0, "\(exportOutput)")
                let (status, output) = try await Self.run(url, ["ledger", "drop", "--month", "2025-01"])
                #expect(status == 0 && output.contains("dropped 2025-01: 1 rows (partition usage_ledger_p202501)"), "\(output)")
                let partitions = try await P.partitions(client)
                #expect(!partitions.contains("usage_ledger_p202501") && partitions.contains("usage_ledger_p202502"))
                let (verified, verifyOutput) = try await Self.run(url, ["verify"])
                #expect(verified == 0, "\(verifyOutput)")
                let (again, againOutput) = try await Self.run(url, ["ledger", "drop", "--month", "2025-01"])
                #expect(again == 2 && againOutput.contains("refused: 2025-01 was dropped already"), "\(againOutput)")
            }
        }
    }
}
