import ArgumentParser
import CapGate
import Foundation
import Logging

/// `capgate unsettled list|keep|refund`: charges whose provider answer was never recorded.
struct Unsettled: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List, keep or refund charges left unsettled (the gateway died before the provider answered).",
        subcommands: [List.self, Keep.self, Refund.self]
    )

    /// Flags every subcommand takes.
    struct Selection: ParsableArguments {
        @OptionGroup var options: ConfigOptions
        @Option(help: "Only this company (also makes the look-up of ledger ids use the index).") var company: String?
        @Option(
            name: .customLong("older-than"),
            help: "Seconds a charge must be unsettled, counted from its creation (default 3600; 0 takes pending ones too).")
        var olderThan: Double = UnsettledCharges.defaultGrace

        func companyID() throws -> UUID? {
            guard let company else { return nil }
            guard let id = UUID(uuidString: company) else {
                throw ConfigurationError(key: "--company", problem: "must be a company id (UUID)")
            }
            return id
        }

        func load() async throws -> (DatabaseURL, UUID?, Logger) {
            guard olderThan >= 0 else { throw ConfigurationError(key: "--older-than", problem: "must be 0 or more seconds") }
            let configuration = try await options.load()
            let url = try configuration.require(configuration.database.url, key: "database.url")
            let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
            return (try DatabaseURL(url), try companyID(), logger)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the unsettled charges, oldest first.")
        @OptionGroup var selection: Selection
        @Option(help: "At most this many charges.") var limit: Int = 1000

        func run() async throws {
            try await runCommand {
                let (url, company, logger) = try await selection.load()
                let charges = try await CapGateRunner.unsettledList(
                    url: url, company: company, olderThan: selection.olderThan, limit: max(1, limit), logger: logger)
                for charge in charges { print(charge) }
                print("\(charges.count) unsettled charges")
            }
        }
    }

    struct Keep: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep these charges: they stand, marked settled with no provider status; exit 1 if any was skipped.")
        @OptionGroup var selection: Selection
        @Argument(help: "Ledger row ids (from `capgate unsettled list`).") var ids: [Int64]

        func run() async throws {
            try await runCommand {
                let (url, company, logger) = try await selection.load()
                let done = try await CapGateRunner.unsettledKeep(
                    url: url, ids: ids, company: company, olderThan: selection.olderThan, logger: logger)
                try Unsettled.report(done)
            }
        }
    }

    struct Refund: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Give these charges back (counters and ledger together, Idempotency-Key freed); exit 1 if any was skipped.")
        @OptionGroup var selection: Selection
        @Argument(help: "Ledger row ids (from `capgate unsettled list`).") var ids: [Int64]

        func run() async throws {
            try await runCommand {
                let (url, company, logger) = try await selection.load()
                let done = try await CapGateRunner.unsettledRefund(
                    url: url, ids: ids, company: company, olderThan: selection.olderThan, logger: logger)
                try Unsettled.report(done)
            }
        }
    }

    static func report(_ resolutions: [UnsettledCharges.Resolution]) throws {
        for resolution in resolutions { print(resolution) }
        if resolutions.contains(where: { !$0.done }) { throw ExitCode(1) }
    }
}
