import CapGate
import Foundation
import Logging
import ServiceLifecycle

/// `capgate db` and `capgate mock`: the embedded PostgreSQL or the mock provider on their
/// own, for the benchmark harness and for trying CapGate against a real provider locally.
public enum StandaloneServices {
    /// Starts the embedded PostgreSQL in `directory`, prints its URL, and keeps it running until
    /// SIGINT/SIGTERM, then stops it.
    public static func runDatabase(directory: String, settings: [String: String], urlFile: String?, logger: Logger) async throws {
        let cluster = try EmbeddedPostgres.start(directory: directory, settings: settings, logger: logger)
        defer { cluster.stop() }
        let url = cluster.url.text
        if let urlFile { try url.write(toFile: urlFile, atomically: true, encoding: .utf8) }
        FileHandle.standardOutput.write(Data("DATABASE_URL=\(url)\n".utf8))
        let group = ServiceGroup(
            configuration: .init(
                services: [.init(service: ClosingService(name: "embedded-postgres") {})],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            )
        )
        try await group.run()
    }

    /// Runs the mock provider on `host:port` until SIGINT/SIGTERM (`lean`: ``LeanMockProvider``).
    public static func runMock(host: String, port: Int, lean: Bool = false, logger: Logger) async throws {
        if lean {
            try await LeanMockProvider.run(host: host, port: port, logger: logger)
            return
        }
        let app = MockProvider().buildApplication(host: host, port: port, logger: logger)
        try await app.runService()
    }
}
