import CapGateDev
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The one way CapGate and its tests start programs: every end is seen (a thread blocked in
/// `waitpid` on the child alone), the status is the shell's, output is captured whole, and a
/// child past its time is killed by its process id.
@Suite("Child processes: their end is never missed", .timeLimit(.minutes(2)))
struct ChildProcessTests {
    @Test("the status is the exit code: `exit 3` is 3, `true` 0, a missing program 127 through env")
    func exitCodes() async throws {
        #expect(await (try ChildProcess("/bin/sh", ["-c", "exit 3"])).wait() == 3)
        #expect(try ChildProcess("/bin/true").waitUntilExit() == 0)
        #expect(await (try ChildProcess("/usr/bin/env", ["capgate-no-such-program"])).wait() == 127)
    }

    @Test("a program that cannot start throws, naming it")
    func cannotStart() {
        let error = #expect(throws: ChildProcess.Failure.self) { try ChildProcess("/nonexistent/capgate-program") }
        #expect(error?.description.hasPrefix("capgate-program could not start: ") == true, "\(String(describing: error))")
    }

    @Test("death by a signal is 128 + the signal; nothing is sent once the child is reaped")
    func deathBySignal() async throws {
        let sleeper = try ChildProcess("/bin/sleep", ["60"])
        #expect(sleeper.isRunning)
        #expect(sleeper.terminate(signal: SIGKILL))
        #expect(await sleeper.wait() == 128 + SIGKILL)
        #expect(!sleeper.isRunning)
        #expect(!sleeper.terminate(signal: SIGKILL), "a reaped child's process id may be another's")
        #expect(await (try ChildProcess("/bin/sh", ["-c", "kill -TERM $$"])).wait() == 128 + SIGTERM)
        // Signals start at their defaults in the child, whatever this process does with them.
        let interrupted = try ChildProcess("/bin/sleep", ["60"])
        interrupted.terminate(signal: SIGINT)
        #expect(interrupted.waitUntilExit() == 128 + SIGINT)
    }

    @Test("output is captured exactly, 600 KB of it (more than a pipe holds); errors apart or with it")
    func capturedOutput() async throws {
        let lines = try await ChildProcess.run("/usr/bin/seq", ["1", "100000"], timeout: .seconds(60))
        let expected = (1...100_000).map(String.init).joined(separator: "\n") + "\n"
        #expect(lines.status == 0)
        #expect(lines.output.count == expected.utf8.count)
        #expect(lines.outputText == expected)

        let script = "echo out; echo err >&2; echo more"
        let apart = try await ChildProcess.run("/bin/sh", ["-c", script], errors: .capture, timeout: .seconds(30))
        #expect(apart.outputText == "out\nmore\n")
        #expect(String(decoding: apart.errors, as: UTF8.self) == "err\n")
        let together = try await ChildProcess.run("/bin/sh", ["-c", script], timeout: .seconds(30))
        #expect(together.outputText == "out\nerr\nmore\n")
        let discarded = try await ChildProcess.run("/bin/sh", ["-c", script], output: .null, errors: .null, timeout: .seconds(30))
        #expect(discarded.output.isEmpty && discarded.errors.isEmpty)
    }

    @Test("input bytes reach the child: 300 KB of scrambled bytes come back through cat unchanged")
    func inputBytes() async throws {
        // Scrambled bytes from a cheap generator (this suite runs beside timing tests).
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15
        let bytes = (0..<300_000).map { _ -> UInt8 in
            seed ^= seed << 13
            seed ^= seed >> 7
            seed ^= seed << 17
            return UInt8(truncatingIfNeeded: seed >> 32)
        }
        let echoed = try await ChildProcess.run("/bin/cat", input: .bytes(bytes), timeout: .seconds(30))
        #expect(echoed.status == 0)
        #expect(echoed.output == bytes)
        let read = try await ChildProcess.run(
            "/bin/sh", ["-c", "read line; echo \"got $line\""], input: .bytes(Array("hello\n".utf8)), timeout: .seconds(30))
        #expect(read.outputText == "got hello\n")
        let empty = try await ChildProcess.run("/bin/cat", timeout: .seconds(30))
        #expect(empty.status == 0 && empty.output.isEmpty, "standard input is /dev/null by default")
    }

    @Test("the working directory and an exact environment are the child's")
    func directoryAndEnvironment() async throws {
        let child = try await ChildProcess.run(
            "/bin/sh", ["-c", "pwd; echo \"$CAPGATE_CHILD_TEST${HOME:-, no HOME}\""], environment: ["CAPGATE_CHILD_TEST": "set"],
            directory: "/usr", timeout: .seconds(30))
        #expect(child.outputText == "/usr\nset, no HOME\n")
    }

    @Test("run(timeout:) kills a child past its time (SIGKILL, by its process id) and throws naming the program")
    func timeout() async throws {
        let pidFile = NSTemporaryDirectory() + "capgate-child-test-\(UUID().uuidString).pid"
        defer { try? FileManager.default.removeItem(atPath: pidFile) }
        let started = ContinuousClock.now
        let error = await #expect(throws: ChildProcess.Failure.self) {
            try await ChildProcess.run("/bin/sh", ["-c", "echo $$ > \(pidFile); exec sleep 60"], name: "sleeper", timeout: .seconds(1))
        }
        #expect(error?.description.hasPrefix("sleeper did not end within") == true, "\(String(describing: error))")
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .seconds(1) && elapsed < .seconds(5), "\(elapsed)")
        let pid = try #require(Int32(try String(contentsOfFile: pidFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(kill(pid, 0) == -1 && errno == ESRCH, "the killed child is gone (reaped)")

        let quick = try await ChildProcess.run("/bin/echo", ["in time"], timeout: .seconds(30))
        #expect(quick.outputText == "in time\n")
        let waited = try ChildProcess("/bin/sleep", ["60"])
        #expect(await waited.wait(timeout: .milliseconds(200)) == nil, "still running: wait(timeout:) gives nil and leaves it")
        #expect(waited.isRunning)
        waited.terminate(signal: SIGKILL)
        #expect(await waited.wait(timeout: .seconds(10)) == 128 + SIGKILL)
    }

    @Test("a cancelled run kills its child and throws CancellationError")
    func cancelledRun() async throws {
        let started = ContinuousClock.now
        let task = Task { try await ChildProcess.run("/bin/sleep", ["60"], timeout: .seconds(120)) }
        try await Task.sleep(for: .milliseconds(300))
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(ContinuousClock.now - started < .seconds(10))
    }

    @Test("200 short children started at once from a task group: every end is seen, each with its own status")
    func manyAtOnce() async throws {
        // 200 processes at once take both cores of a small machine for a few hundred ms: they
        // start once the unit layer's one timing test (BatchQueueTests' staggered waits, 140 ms
        // of slack, which runs beside this suite) is past, or they made it fail one run in two.
        try await Task.sleep(for: .seconds(2))
        let statuses = try await withThrowingTaskGroup(of: (Int, Int32?).self) { group in
            for index in 0..<200 {
                group.addTask {
                    let child = try await ChildProcess.run(
                        "/bin/sh", ["-c", "exit \(index % 100)"], output: .null, errors: .null, timeout: .seconds(60))
                    return (index, child.status)
                }
            }
            return try await group.reduce(into: [Int: Int32?]()) { $0[$1.0] = $1.1 }
        }
        #expect(statuses.count == 200)
        #expect(statuses.allSatisfy { $0.value == Int32($0.key % 100) })
    }

    @Test("a child that leaves a grandchild holding its output open (a file, or the capture) is seen ending at once")
    func grandchildHoldsOutput() async throws {
        let file = NSTemporaryDirectory() + "capgate-child-test-\(UUID().uuidString).log"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let started = ContinuousClock.now
        let child = try ChildProcess("/bin/sh", ["-c", "sleep 30 & echo $!; exit 0"], output: .file(file), errors: .sameAsOutput)
        #expect(await child.wait(timeout: .seconds(10)) == 0)
        #expect(ContinuousClock.now - started < .seconds(5))
        let grandchild = Int32(try String(contentsOfFile: file, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(grandchild != nil)
        if let grandchild { kill(grandchild, SIGKILL) }

        let captured = try await ChildProcess.run("/bin/sh", ["-c", "sleep 30 & echo $!; exit 0"], timeout: .seconds(10))
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(captured.status == 0)
        if let other = Int32(captured.outputText.trimmingCharacters(in: .whitespacesAndNewlines)) { kill(other, SIGKILL) }
    }
}
