import CapGate
import Foundation
import Hummingbird
import Logging
import ServiceLifecycle

/// `capgate dev`: the embedded default. With no `database.url` it starts a private PostgreSQL
/// under the dev folder; it migrates, loads the demo data, starts the mock provider when no
/// `upstream.url` is set, runs the gateway and prints ready-to-paste examples. Ctrl-C (or
/// SIGTERM) stops the gateway, the mock and the database.
///
/// With `replica` (`capgate dev --replica`) the embedded database is a primary with a
/// synchronous streaming standby (``EmbeddedReplicaSet``) and the gateway gets both hosts in a
/// multi-host URL, so a failover can be tried by hand: the commands are printed at start.
public enum DevEnvironment {
    public static func run(configuration: CapGateConfiguration, directory: String, replica: Bool = false, logger: Logger) async throws {
        var configuration = configuration
        let folder = URL(fileURLWithPath: directory, relativeTo: URL(fileURLWithPath: FileManager.default.currentDirectoryPath))
            .standardized.path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)

        var embedded: EmbeddedPostgres? = nil
        var replicaSet: EmbeddedReplicaSet? = nil
        if configuration.database.url == nil {
            let started = try startDatabase(folder: folder, replica: replica, logger: logger)
            (embedded, replicaSet) = (started.0, started.1)
            configuration.database.url = started.1?.url.text ?? started.0.url.text
        }
        defer {
            // The stop's steps are logged with their times, so a slow Ctrl-C says where it waited.
            let stopping = ContinuousClock.now
            if let replicaSet { replicaSet.stop() } else { embedded?.stop() }
            if embedded != nil {
                logger.info("embedded PostgreSQL stopped", metadata: ["took": "\(ContinuousClock.now - stopping)"])
            }
        }

        let url = try DatabaseURL(configuration.database.url!)
        try await migrate(url: url, folder: folder, embedded: embedded != nil, logger: logger)
        let operatorToken = configuration.operators.token
        let seed = try await CapGateRunner.withClient(url: url, logger: logger) { client in
            try await DemoSeed.ensure(client: client, directory: folder, operatorToken: operatorToken, logger: logger)
        }
        configuration.operators.token = seed.operatorToken

        // The log output first: it stops last, after the gateway's final lines.
        var services: [any Service] = [LogOutput.standardError]
        if configuration.upstream.url == nil {
            let mockPort = try EmbeddedPostgres.freePort()
            var mockLogger = logger
            mockLogger.logLevel = .warning
            services.append(MockProvider().buildApplication(port: mockPort, logger: mockLogger))
            configuration.upstream.url = "http://127.0.0.1:\(mockPort)"
            logger.info("mock provider", metadata: ["url": "http://127.0.0.1:\(mockPort)"])
        }
        let finalConfiguration = configuration
        let printedReplicaSet = replicaSet
        let gateway = try await buildApplication(configuration: configuration, logger: logger) { channel in
            let port = channel.localAddress?.port ?? finalConfiguration.http.port
            var text = examples(
                host: finalConfiguration.http.host, port: port, seed: seed,
                mock: finalConfiguration.upstream.url?.contains("127.0.0.1") ?? false,
                https: finalConfiguration.http.tls != nil)
            if let printedReplicaSet { text += failoverExamples(printedReplicaSet) }
            FileHandle.standardOutput.write(Data(text.utf8))
        }
        services.append(gateway)
        let group = ServiceGroup(
            configuration: .init(
                services: services.map { .init(service: $0) }, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await group.run()
        logger.info("gateway stopped; stopping the embedded PostgreSQL")
    }

    /// The embedded cluster under `folder`: one primary, or with `replica` a primary and its
    /// synchronous standby.
    static func startDatabase(
        folder: String, replica: Bool, logger: Logger
    ) throws -> (EmbeddedPostgres, EmbeddedReplicaSet?) {
        if replica {
            logger.info(
                "starting embedded PostgreSQL with a synchronous standby",
                metadata: ["primary": "\(folder)/postgres", "standby": "\(folder)/postgres-standby"])
            let set = try EmbeddedReplicaSet.start(
                primaryDirectory: folder + "/postgres", standbyDirectory: folder + "/postgres-standby", logger: logger)
            return (set.primary, set)
        }
        logger.info("starting embedded PostgreSQL", metadata: ["folder": "\(folder)/postgres"])
        return (try EmbeddedPostgres.start(directory: folder + "/postgres", logger: logger), nil)
    }

    /// Migrates; an embedded database whose applied migrations this build does not know is
    /// ``StaleDevDatabase`` (a dev folder from another checkout).
    static func migrate(url: DatabaseURL, folder: String, embedded: Bool, logger: Logger) async throws {
        do {
            for line in try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger) {
                logger.info("migrate", metadata: ["result": "\(line)"])
            }
        } catch let error as Migrator.MigrationError where embedded {
            switch error {
            case .changedAfterApplied, .unknownApplied, .tooOld:
                throw StaleDevDatabase(folder: folder, reason: error.description)
            default:
                throw error
            }
        }
    }

    /// How to try a failover by hand, printed at start under `--replica`.
    static func failoverExamples(_ set: EmbeddedReplicaSet) -> String {
        let asPostgres = set.primary.asRoot ? "runuser -u postgres -- " : ""
        return """
            Replica mode: primary 127.0.0.1:\(set.primary.port), synchronous standby 127.0.0.1:\(set.standby.port).
            Try a failover (the gateway moves to the promoted standby by itself; calls in between get 503):
              kill -9 $(head -1 \(set.primary.dataDirectory)/postmaster.pid)
              \(asPostgres)\(set.standby.binDirectory)/pg_ctl promote -D \(set.standby.dataDirectory)
            The next start makes a new standby from the old primary's data (writes made after the failover are dropped).

            """
    }

    /// The ready-to-paste curl and SDK examples printed at start (`https` when `http.tls.*` are set).
    static func examples(host: String, port: Int, seed: DemoSeed, mock: Bool, https: Bool = false) -> String {
        let base = "\(https ? "https" : "http")://\(host):\(port)"
        let company = seed.companyID.uuidString.lowercased()
        return """

            CapGate dev is running at \(base)\(mock ? " (forwarding to the built-in mock provider)" : "")

              operator token : \(seed.operatorToken)
              admin key      : \(seed.adminKey)
              member key     : \(seed.memberKey)
              demo company   : \(company) (plan low: 100 per company, 25 per user)

            A call through the gateway:
              curl -s \(base)/v1/messages -H 'x-api-key: \(seed.memberKey)' -H 'anthropic-version: 2023-06-01' \\
                -H 'content-type: application/json' \\
                -d '{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}'

            A streamed call:
              curl -sN \(base)/v1/messages -H 'x-api-key: \(seed.memberKey)' -H 'content-type: application/json' \\
                -d '{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hello"}]}'

            Features (plan low: 10 analyses a day for the company, 5 per user; chat unlimited;
            compatibility not included). The route table makes GET /v1/models* and count_tokens
            free, and POST /v1/messages cost one analysis unless CapGate-Feature names another:
              curl -s \(base)/v1/messages -H 'x-api-key: \(seed.memberKey)' -H 'CapGate-Feature: compatibility' \
                -H 'content-type: application/json' \
                -d '{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}'
              (402 feature_not_in_plan, naming the medium plan; a sixth analysis today is 402 feature_limit_exceeded)
              curl -s \(base)/v1/models -H 'x-api-key: \(seed.memberKey)'   (free)

            Threshold notifications (80 % and 100 % of every limit): four analyses by the member
            today reach 80 % of their 5; each crossing is one row, read it as the admin:
              curl -s \(base)/admin/v1/companies/\(company)/notifications -H 'x-api-key: \(seed.adminKey)'
            To receive them as signed webhooks (Standard Webhooks), start with
              NOTIFY_WEBHOOK_URL=http://127.0.0.1:9000/hooks NOTIFY_WEBHOOK_SECRET=whsec_$(head -c 24 /dev/urandom | base64)
            and run any receiver on that port (docs/notifications.md has one in Python).

            The usage console in a browser (paste the admin key, or the operator token):
              \(base)/console

            Your usage:
              curl -s \(base)/v1/usage -H 'x-api-key: \(seed.memberKey)'

            The company's usage (admin):
              curl -s \(base)/admin/v1/companies/\(company)/usage -H 'x-api-key: \(seed.adminKey)'

            Every company (operator):
              curl -s \(base)/admin/v1/companies -H 'Authorization: Bearer \(seed.operatorToken)'

            Python (pip install anthropic):
              import anthropic
              client = anthropic.Anthropic(base_url="\(base)", api_key="\(seed.memberKey)")
              print(client.messages.create(model="claude-sonnet-4-6", max_tokens=64,
                    messages=[{"role": "user", "content": "Hello"}]).content[0].text)

            Ctrl-C stops the gateway\(mock ? ", the mock provider" : "") and the embedded database.

            """
    }
}

/// The embedded dev database was made with migrations this build does not have (a checkout
/// from before a migration changed, or from a newer build).
struct StaleDevDatabase: Error, CustomStringConvertible {
    let folder: String
    let reason: String

    var description: String {
        "the demo database in \(folder) does not match this build (\(reason)); "
            + "delete that folder to start a fresh demo database, or set DATABASE_URL"
    }
}
