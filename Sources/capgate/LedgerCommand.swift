import ArgumentParser
import CapGate
import Foundation

/// `capgate ledger …`: the ledger's whole months (issue #50): export one, drop one past the retention.
struct Ledger: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Work on the ledger's whole months: export one, drop one past ledger.retentionMonths.",
        subcommands: [Export.self, Drop.self]
    )

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write one whole UTC month of the ledger to a file (JSON lines or CSV) with its SHA-256, and record it."
        )
        @OptionGroup var options: ConfigOptions
        @Option(help: "The month, YYYY-MM (UTC); it must have ended.") var month: String
        @Option(name: .customLong("to"), help: "The file to write; refused if it exists. FILE.sha256 is written beside it.")
        var file: String
        @Option(help: "jsonl (default) or csv.") var format: String = "jsonl"

        func run() async throws {
            try await runCommand {
                do {
                    // The refusals that need no configuration come first: nothing is read or written.
                    _ = try LedgerExport.Request(month: month, path: file, format: format)
                    let configuration = try await options.load()
                    let url = try configuration.require(configuration.database.url, key: "database.url")
                    let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
                    let summary = try await CapGateRunner.ledgerExport(
                        url: try DatabaseURL(url), month: month, to: file, format: format, logger: logger)
                    print(summary)
                } catch let refusal as LedgerExport.Refusal {
                    FileHandle.standardError.write(Data((refusal.description + "\n").utf8))
                    throw ExitCode(2)
                }
            }
        }
    }
}

extension Ledger {
    struct Drop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Detach and drop one whole UTC month of the ledger: past ledger.retentionMonths, exported and unchanged since, all settled."
        )
        @OptionGroup var options: ConfigOptions
        @Option(help: "The month, YYYY-MM (UTC).") var month: String

        func run() async throws {
            try await runCommand {
                do {
                    // A malformed month is refused before the configuration is read.
                    guard LedgerMonth(month) != nil else { throw LedgerRetention.Refusal.malformedMonth(month) }
                    let configuration = try await options.load()
                    let url = try configuration.require(configuration.database.url, key: "database.url")
                    let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
                    let dropped = try await CapGateRunner.ledgerDrop(
                        url: try DatabaseURL(url), month: month, retention: configuration.ledgerRetentionMonths, logger: logger)
                    print(dropped)
                } catch let refusal as LedgerRetention.Refusal {
                    FileHandle.standardError.write(Data((refusal.description + "\n").utf8))
                    throw ExitCode(2)
                } catch let refusal as LedgerExport.Refusal {
                    FileHandle.standardError.write(Data((refusal.description + "\n").utf8))
                    throw ExitCode(2)
                }
            }
        }
    }
}
