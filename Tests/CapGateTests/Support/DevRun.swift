import Foundation

@testable import CapGateDev

/// `capgate dev` as the system tests run it: the built binary, in an empty folder of its own, on
/// a free port, with none of the configuration a developer's shell may hold, its output in
/// `dev.log` there.
struct DevRun {
    let folder: String
    let port: Int
    let process: ChildProcess
    var base: String { "http://127.0.0.1:\(port)" }
    var logPath: String { folder + "/dev.log" }

    /// Starts `capgate dev` with `arguments` (after `--port` and `--directory`).
    init(_ arguments: [String] = [], label: String) throws {
        let binary = SDKTests.root.appendingPathComponent(".build/debug/capgate").path
        guard FileManager.default.isExecutableFile(atPath: binary) else { throw NotBuilt() }
        folder = NSTemporaryDirectory() + "capgate-\(label)-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        port = try EmbeddedPostgres.freePort()
        var environment = ProcessInfo.processInfo.environment
        for key in ["DATABASE_URL", "UPSTREAM_URL", "OPERATOR_TOKEN", "HTTP_PORT", "CAPGATE_CONFIG"] { environment[key] = nil }
        process = try ChildProcess(
            binary, ["dev", "--port", String(port), "--directory", folder + "/.capgate"] + arguments, environment: environment,
            directory: folder, output: .file(folder + "/dev.log"), errors: .sameAsOutput)
    }

    /// What it printed so far.
    func output() -> String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Stops it if it still runs, and removes its folder.
    func end() {
        process.terminate()
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: folder)
    }

    struct NotBuilt: Error, CustomStringConvertible {
        var description: String { "build the binary first: swift build" }
    }
}
