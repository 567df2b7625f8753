import Foundation
import Logging
import Testing

@testable import CapGateDev

#if canImport(Glibc)
    import Glibc
#endif

/// A cluster's `postmaster.pid` names its postmaster only while that process lives and works in
/// the data directory: a killed postmaster's number is soon another process's, and stopping the
/// cluster must then neither signal that process nor wait for it (``EmbeddedPostgres/postmasterPID``).
@Suite("The postmaster behind postmaster.pid, checked", .timeLimit(.minutes(1)))
struct PostmasterPIDTests {
    /// A data directory with `postmaster.pid` naming `pid` (as PostgreSQL writes it: the number,
    /// then the folder and more lines), and a cluster value for it that runs nothing.
    static func cluster(pid: pid_t, in folder: String? = nil) throws -> (EmbeddedPostgres, String) {
        let data = folder ?? NSTemporaryDirectory() + "capgate-pidfile-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        try "\(pid)\n\(data)\n1764400000\n5432\n".write(toFile: data + "/postmaster.pid", atomically: true, encoding: .utf8)
        let cluster = EmbeddedPostgres(
            dataDirectory: data, port: 5432, password: "", binDirectory: "/nonexistent", asRoot: false, options: "",
            logger: Logger(label: "test"))
        return (cluster, data)
    }

    @Test("a live process working in the data directory is the postmaster; the same number in another folder's file is not")
    func livePostmaster() async throws {
        let data = NSTemporaryDirectory() + "capgate-pidfile-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: data) }
        let sleeper = try ChildProcess("/bin/sleep", ["30"], directory: data)
        defer {
            sleeper.terminate(signal: SIGKILL)
            sleeper.waitUntilExit()
        }
        let (cluster, _) = try Self.cluster(pid: sleeper.pid, in: data)
        #expect(cluster.postmasterPID == sleeper.pid)
        #expect(!cluster.hasStalePIDFile)
        let (elsewhere, other) = try Self.cluster(pid: sleeper.pid)
        defer { try? FileManager.default.removeItem(atPath: other) }
        #expect(elsewhere.postmasterPID == nil)
        #expect(elsewhere.hasStalePIDFile)
    }

    @Test("a number now another process's (this test's own) is stale: removed on stop, nothing signalled")
    func reusedNumber() throws {
        let (cluster, data) = try Self.cluster(pid: getpid())
        defer { try? FileManager.default.removeItem(atPath: data) }
        #expect(cluster.postmasterPID == nil)
        #expect(cluster.hasStalePIDFile)
        // pg_ctl (here a path that does not exist) is never run for it: the file goes, this
        // process lives on.
        cluster.stop()
        #expect(!FileManager.default.fileExists(atPath: data + "/postmaster.pid"))
    }

    @Test("a process that ended is no postmaster; a file without a number names none")
    func endedProcess() async throws {
        let ended = try ChildProcess("/bin/true")
        ended.waitUntilExit()
        let (cluster, data) = try Self.cluster(pid: ended.pid)
        defer { try? FileManager.default.removeItem(atPath: data) }
        #expect(cluster.postmasterPID == nil)
        cluster.kill()
        #expect(!FileManager.default.fileExists(atPath: data + "/postmaster.pid"))
        try "not a number\n".write(toFile: data + "/postmaster.pid", atomically: true, encoding: .utf8)
        #expect(cluster.postmasterPID == nil)
        #expect(EmbeddedPostgres.pidFileProcess(data) == nil)
    }
}
