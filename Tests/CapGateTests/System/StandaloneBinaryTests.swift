import AsyncHTTPClient
import CapGateDev
import Foundation
import NIOCore
import Testing

@testable import CapGate

/// `db/`, `console/` and `openapi.yaml` are built into the binary (the `EmbedResourcesPlugin`):
/// the binary alone, copied to an empty folder and run from another, migrates and serves them.
@Suite("The capgate binary alone, copied elsewhere and run from another folder", .timeLimit(.minutes(5)))
struct StandaloneBinaryTests {
    @Test(
        "a copy of the binary, run from an empty folder, migrates a fresh database and serves /console and /openapi.yaml as the repository has them"
    )
    func copiedBinary() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        let fm = FileManager.default
        let base = NSTemporaryDirectory() + "capgate-alone-\(UUID().uuidString)"
        let bin = base + "/bin"
        let cwd = base + "/elsewhere"
        try fm.createDirectory(atPath: bin, withIntermediateDirectories: true)
        try fm.createDirectory(atPath: cwd, withIntermediateDirectories: true)
        defer { try? fm.removeItem(atPath: base) }
        let binary = bin + "/capgate"
        try fm.copyItem(atPath: CommandTests.binary, toPath: binary)
        // Nothing beside the binary (no resource bundle, no db/) and nothing in its working folder.
        #expect(try fm.contentsOfDirectory(atPath: bin) == ["capgate"])
        #expect(try fm.contentsOfDirectory(atPath: cwd).isEmpty)

        let name = "alone_" + UUID().uuidString.prefix(8).lowercased()
        let url = try await offPool { try TestCluster.shared.get().createDatabase(name) }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        let environment = ["DATABASE_URL": url.text, "PATH": path]
        let (migrated, migrateOut) = try await Self.run(binary, ["migrate"], in: cwd, environment: environment)
        #expect(migrated == 0, "\(migrateOut)")
        let migrations = try fm.contentsOfDirectory(atPath: SDKTests.root.appendingPathComponent("db/migrations").path)
            .filter { $0.hasSuffix(".sql") }.sorted()
        let applied: [String] = migrateOut.split(separator: "\n").map(String.init)
        let expected: [String] = migrations.map { "applied " + String($0.dropLast(4)) } + ["applied db/functions"]
        #expect(applied == expected)
        let (again, againOut) = try await Self.run(binary, ["migrate", "--dry-run"], in: cwd, environment: environment)
        #expect(again == 0)
        #expect(againOut.contains("nothing to apply"), "\(againOut)")

        try await Harness.with(database: url) { h in
            let port = try EmbeddedPostgres.freePort()
            let serveEnvironment = environment.merging([
                "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port), "OPERATOR_TOKEN": "op_alone-operator-token-for-the-tests",
                "LOG_LEVEL": "warning",
            ]) { _, new in new }
            let serve = try ChildProcess(
                binary, ["serve", "--set", "spool.directory=\(base)/spool"], environment: serveEnvironment, directory: cwd,
                output: .null, errors: .null)
            defer { serve.terminate() }
            let gateway = "http://127.0.0.1:\(port)"
            let ready = try await Harness.ready(gateway)
            try #require(ready, "capgate serve did not become ready (its migrations are not the database's?)")

            let scripts = ConsoleRoutes.scripts.map { ("/console/" + $0, "console/" + $0, "text/javascript") }
            for (route, file, type) in [
                ("/console", "console/index.html", "text/html"), ("/console/console.css", "console/console.css", "text/css"),
                ("/openapi.yaml", "openapi.yaml", "application/yaml"),
            ] + scripts {
                let reply = try await h.request(.GET, route, base: gateway)
                #expect(reply.status == 200, "\(route)")
                #expect(reply.headers.first(name: "content-type")?.hasPrefix(type) == true, "\(route)")
                let expected = try String(contentsOf: SDKTests.root.appendingPathComponent(file), encoding: .utf8)
                #expect(reply.body == expected, "\(route) is not \(file)")
            }
            serve.terminate()
            #expect(await serve.wait(timeout: .seconds(30)) == 0)
        }
    }

    @Test("the migrations and functions built into the binary are the repository's db/ files, byte for byte")
    func embeddedMigrationsAreTheRepositorys() throws {
        let built = Migrator()
        let files = try Migrator(folder: SDKTests.root.appendingPathComponent("db/migrations").path)
        #expect(built.migrations.map(\.version) == files.migrations.map(\.version))
        #expect(built.migrations.map(\.checksum) == files.migrations.map(\.checksum))
        #expect(built.functions?.files.map(\.name) == files.functions?.files.map(\.name))
        #expect(built.functions?.files.map(\.checksum) == files.functions?.files.map(\.checksum))
    }

    @Test("no gateway source finds a file through #filePath or the working directory")
    func noSourcePaths() throws {
        let sources = SDKTests.root.appendingPathComponent("Sources/CapGate")
        let enumerator = try #require(FileManager.default.enumerator(atPath: sources.path))
        for case let name as String in enumerator where name.hasSuffix(".swift") {
            let text = try String(contentsOf: sources.appendingPathComponent(name), encoding: .utf8)
            #expect(!text.contains("#filePath"), "\(name)")
            #expect(!text.contains("currentDirectoryPath"), "\(name)")
        }
    }

    /// Runs `executable` in `folder` with exactly `environment` to its end.
    static func run(
        _ executable: String, _ arguments: [String], in folder: String, environment: [String: String]
    ) async throws -> (
        Int32, String
    ) {
        try await SDKTests.run(URL(fileURLWithPath: executable), arguments, environment: environment, folder: URL(fileURLWithPath: folder))
    }
}
