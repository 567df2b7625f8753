import ArgumentParser
import CapGate
import CapGateDev
import Foundation
import Logging

struct CapGateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "capgate",
        abstract: "CapGate: a multi-tenant usage-cap gateway for AI provider calls.",
        subcommands: [
            Serve.self, CheckConfig.self, Dev.self, Migrate.self, Rollover.self, Verify.self, Unsettled.self, Ledger.self, Database.self,
            Mock.self, BenchReader.self,
        ]
    )
}

/// Flags shared by every command; each overrides the environment and `config/capgate.json`.
struct ConfigOptions: ParsableArguments {
    @Option(help: "Configuration file (default: CAPGATE_CONFIG or config/capgate.json).")
    var config: String?
    @Option(help: "http.host") var host: String?
    @Option(help: "http.port") var port: Int?
    @Option(name: .customLong("database-url"), help: "database.url") var databaseURL: String?
    @Option(name: .customLong("upstream-url"), help: "upstream.url") var upstreamURL: String?
    @Option(name: .customLong("set"), help: "Any configuration key, as key=value (repeatable).") var settings: [String] = []

    func load() async throws -> CapGateConfiguration {
        var flags: [String: String] = [:]
        for setting in settings {
            let parts = setting.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, CapGateConfiguration.keys.contains(parts[0]) else {
                throw ConfigurationError(key: "--set \(setting)", problem: "is not key=value with a known key")
            }
            flags[parts[0]] = parts[1]
        }
        if let host { flags["http.host"] = host }
        if let port { flags["http.port"] = String(port) }
        if let databaseURL { flags["database.url"] = databaseURL }
        if let upstreamURL { flags["upstream.url"] = upstreamURL }
        return try await CapGateConfiguration.load(flags: flags, file: config)
    }
}

/// Runs a command body, turning configuration errors into one line and exit code 2.
func runCommand(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let error as ConfigurationError {
        FileHandle.standardError.write(Data((error.description + "\n").utf8))
        throw ExitCode(2)
    } catch let error as ExitCode {
        throw error
    } catch {
        FileHandle.standardError.write(Data(("error: \(error)\n").utf8))
        throw ExitCode(1)
    }
}

func bootstrapLogging(_ level: String) -> Logger {
    let parsed = Logger.Level(rawValue: level.lowercased()) ?? .info
    LoggingSystem.bootstrap { label in LogfmtHandler(label: label, level: parsed) }
    return Logger(label: "capgate")
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the gateway (migrates the database first).")
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            _ = try configuration.require(configuration.database.url, key: "database.url")
            _ = try configuration.require(configuration.upstream.url, key: "upstream.url")
            let logger = bootstrapLogging(configuration.logLevel)
            try await CapGateRunner.serve(configuration: configuration, logger: logger)
        }
    }
}

struct CheckConfig: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Check what serve would start with (keys, files, the database's schema); exit 0, or 2 naming what is wrong."
    )
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
            let lines = try await CapGateRunner.checkConfiguration(configuration, logger: logger)
            print(lines.joined(separator: "\n"))
        }
    }
}

struct Dev: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run everything locally: embedded PostgreSQL under .capgate/, demo data, mock provider, gateway."
    )
    @OptionGroup var options: ConfigOptions
    @Option(help: "Folder for the embedded database and demo keys.") var directory: String = ".capgate"
    @Flag(help: "Embedded PostgreSQL as a primary with a synchronous streaming standby, to try a failover (ignored with --database-url).")
    var replica = false

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            let logger = bootstrapLogging(configuration.logLevel)
            try await DevEnvironment.run(configuration: configuration, directory: directory, replica: replica, logger: logger)
        }
    }
}

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Apply pending db/migrations/*.sql files, each once, in order.")
    @OptionGroup var options: ConfigOptions
    @Flag(name: .customLong("dry-run"), help: "List what would run; change nothing.") var dryRun = false

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            let url = try configuration.require(configuration.database.url, key: "database.url")
            let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
            let lines = try await CapGateRunner.migrate(url: try DatabaseURL(url), dryRun: dryRun, logger: logger)
            print(lines.joined(separator: "\n"))
        }
    }
}

struct Rollover: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Move every company whose period ended into the period containing --at.")
    @OptionGroup var options: ConfigOptions
    @Option(help: "The time to roll to (ISO-8601, default now).") var at: String?
    @Flag(name: .customLong("dry-run"), help: "Print the summary; change nothing.") var dryRun = false

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            let url = try configuration.require(configuration.database.url, key: "database.url")
            var when = Date()
            if let at {
                guard let parsed = Timestamp.parse(at) else {
                    throw ConfigurationError(key: "--at", problem: "must be an ISO-8601 time such as 2026-12-01T00:00:00Z")
                }
                when = parsed
            }
            let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
            let summary = try await CapGateRunner.rollover(
                url: try DatabaseURL(url), at: when, dryRun: dryRun, retention: configuration.ledgerRetentionMonths, logger: logger)
            print(summary)
        }
    }
}

struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Recompute every counter from the ledger (exit 1 on any mismatch); report charges left unsettled."
    )
    @OptionGroup var options: ConfigOptions
    @Option(name: .customLong("unsettled-after"), help: "Seconds after which a charge with no settlement is reported (default 3600).")
    var unsettledAfter: Double = UnsettledCharges.defaultGrace
    @Flag(name: .customLong("strict-unsettled"), help: "Exit 1 when a charge is unsettled too (it is not a counter mismatch).")
    var strictUnsettled = false

    func run() async throws {
        try await runCommand {
            let configuration = try await options.load()
            let url = try configuration.require(configuration.database.url, key: "database.url")
            guard unsettledAfter >= 0 else { throw ConfigurationError(key: "--unsettled-after", problem: "must be 0 or more seconds") }
            let logger = bootstrapLogging(configuration.logLevel == "info" ? "warning" : configuration.logLevel)
            let report = try await CapGateRunner.verifyReport(url: try DatabaseURL(url), unsettledAfter: unsettledAfter, logger: logger)
            print(report.lines.joined(separator: "\n"))
            let code = report.exitCode(strictUnsettled: strictUnsettled)
            if code != 0 { throw ExitCode(code) }
        }
    }
}

struct Database: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db",
        abstract: "Run only the embedded PostgreSQL (prints DATABASE_URL; stops on Ctrl-C)."
    )
    @Option(help: "Folder of the cluster.") var directory: String = ".capgate/postgres"
    @Option(name: .customLong("setting"), help: "A postgres setting as name=value (repeatable).") var settings: [String] = []
    @Option(name: .customLong("url-file"), help: "Also write the URL to this file.") var urlFile: String?

    func run() async throws {
        try await runCommand {
            var parsed: [String: String] = [:]
            for setting in settings {
                let parts = setting.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2 else { throw ConfigurationError(key: "--setting \(setting)", problem: "is not name=value") }
                parsed[parts[0]] = parts[1]
            }
            let logger = bootstrapLogging("warning")
            try await StandaloneServices.runDatabase(directory: directory, settings: parsed, urlFile: urlFile, logger: logger)
        }
    }
}

struct Mock: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run only the mock provider (Anthropic Messages API stand-in).")
    @Option(help: "Listen host.") var host: String = "127.0.0.1"
    @Option(help: "Listen port.") var port: Int = 8081
    @Flag(help: "Only the Messages API and the model list, on plain SwiftNIO handlers (the benchmark's provider).")
    var lean = false

    func run() async throws {
        try await runCommand {
            let logger = bootstrapLogging("warning")
            try await StandaloneServices.runMock(host: host, port: port, lean: lean, logger: logger)
        }
    }
}
