import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A program this process started, whose end cannot be missed: `capgate dev`'s PostgreSQL
/// commands and every program the tests run.
///
/// From its start a thread of its own blocks in `waitpid` on the child's process id alone until
/// the child ends: no run loop, no SIGCHLD handler, nothing another part of the process could
/// consume first. (Foundation's `Process` on Linux learns of an end through a run-loop source fed
/// by SIGCHLD; the integration tests once hung with every thread idle and no child left, an end
/// it had missed, issue #48.) The thread is named `child PID NAME`, for a backtrace.
///
/// Captured output goes to a temporary file that is read once the child has ended: a pipe would
/// stall a child writing more than its 64 KiB buffer while nobody reads, and keep a reader
/// waiting for as long as a grandchild (a server the child started) holds it open. For the same
/// reason the child inherits no descriptor of ours but 0, 1 and 2 (see ``spawnLock``).
public final class ChildProcess: Sendable {
    /// Where the child's standard input comes from.
    public enum Input: Sendable, Equatable {
        /// `/dev/null`.
        case null
        /// The file at this path.
        case file(String)
        /// These bytes, from a temporary file (no pipe for this process to keep fed).
        case bytes([UInt8])
    }

    /// Where the child's standard output or standard error goes.
    public enum Output: Sendable, Equatable {
        /// `/dev/null`.
        case null
        /// This process's own.
        case inherit
        /// The file at this path, created or emptied first.
        case file(String)
        /// Kept, and readable as ``output`` (or ``errors``) once the child has ended.
        case capture
        /// For standard error: wherever standard output goes (`2>&1`). For standard output: `inherit`.
        case sameAsOutput
    }

    /// A child that could not be started, or that was stopped for taking too long.
    public enum Failure: Error, CustomStringConvertible {
        /// The program's name, and why.
        case couldNotStart(String, String)
        /// The program's name, and the time it had: it was killed (SIGKILL) when that passed.
        case timedOut(String, Duration)

        public var description: String {
            switch self {
            case .couldNotStart(let name, let reason): "\(name) could not start: \(reason)"
            case .timedOut(let name, let timeout): "\(name) did not end within \(timeout): it was killed (SIGKILL)"
            }
        }
    }

    /// The status ``wait()`` gives when the child's end was reaped by some other part of this
    /// process (a `waitpid(-1)` elsewhere), so its exit status is lost.
    public static let lostStatus: Int32 = -1

    /// The child's process id. Signal it through ``terminate(signal:)``: once the child is
    /// reaped the id may belong to another process.
    public let pid: pid_t
    /// The program's name, for messages.
    public let name: String
    let state: Mutex<State>

    /// Starts `executable` (a path; a bare name is looked up in this process's `PATH`) with
    /// `arguments`, in `directory` (default: this process's), with exactly `environment`
    /// (default: this process's).
    ///
    /// By default its standard input is `/dev/null` and everything it prints is captured in
    /// ``output``. `name` (default: the executable's file name) is what messages call it.
    public init(
        _ executable: String, _ arguments: [String] = [], environment: [String: String]? = nil, directory: String? = nil,
        input: Input = .null, output: Output = .capture, errors: Output = .sameAsOutput, name: String? = nil
    ) throws(Failure) {
        let name = name ?? URL(fileURLWithPath: executable).lastPathComponent
        let files = CaptureFiles(output: output, errors: errors)
        let pid: pid_t
        do {
            pid = try Self.spawn(
                executable, arguments, environment: environment, directory: directory,
                streams: Streams(input: input, output: output, errors: errors, files: files), name: name)
        } catch {
            files.remove()
            throw error
        }
        self.pid = pid
        self.name = name
        self.state = Mutex(State())
        let thread = Thread { [self] in watch(files) }
        thread.name = "child \(pid) \(name)"
        thread.start()
    }

    /// Whether the child has not been seen ending yet.
    public var isRunning: Bool { state.withLock { $0.status == nil } }

    /// The child's exit status, or 128 + the signal that ended it; nil while it runs.
    public var status: Int32? { state.withLock { $0.status } }

    /// What the child wrote to standard output when it was `.capture`d (with standard error
    /// when that was `.sameAsOutput`); complete once the child has ended, empty before.
    public var output: [UInt8] { state.withLock { $0.output } }

    /// ``output`` as text (UTF-8, invalid bytes replaced).
    public var outputText: String { String(decoding: output, as: UTF8.self) }

    /// What the child wrote to standard error when that was `.capture`d on its own.
    public var errors: [UInt8] { state.withLock { $0.errors } }

    /// Sends `signal` to the child, and to no other process: nothing is sent once it has been
    /// reaped (its process id could be another's by then). Whether it was sent.
    @discardableResult
    public func terminate(signal: Int32 = SIGTERM) -> Bool {
        state.withLock { state in
            guard !state.reaped else { return false }
            return kill(pid, signal) == 0
        }
    }

    /// Waits for the child to end: its exit status, or 128 + the signal that ended it. Not
    /// cancellable (see ``wait(timeout:)`` and ``run(_:_:environment:directory:input:output:errors:name:timeout:)``).
    @discardableResult
    public func wait() async -> Int32 {
        let id = state.withLock { $0.newWaiter() }
        return await withCheckedContinuation { continuation in keep(.task(continuation), id: id) } ?? Self.lostStatus
    }

    /// Waits at most `timeout` for the child to end: its status, or nil when it still runs then
    /// (or the task was cancelled first). The child is left running.
    public func wait(timeout: Duration) async -> Int32? {
        await withTaskGroup(of: Int32?.self) { group in
            group.addTask { await self.waitUnlessCancelled() }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? status
        }
    }

    /// Blocks this thread until the child ends: its exit status, or 128 + the signal that ended
    /// it. For synchronous code; from a task, ``wait()`` leaves the thread to others.
    @discardableResult
    public func waitUntilExit() -> Int32 {
        let semaphore = DispatchSemaphore(value: 0)
        let id = state.withLock { $0.newWaiter() }
        keep(.thread(semaphore), id: id)
        semaphore.wait()
        return status ?? Self.lostStatus
    }

    /// Runs a program to its end (see ``init(_:_:environment:directory:input:output:errors:name:)``):
    /// the ended child, with its ``status`` and ``output``. Past `timeout`, or when the task is
    /// cancelled, the child is killed (SIGKILL, by its process id) and waited for, and this throws
    /// ``Failure/timedOut(_:_:)`` naming the program (or `CancellationError`).
    ///
    /// It is started from a thread of its own: starts wait for each other (``spawnLock``), and the
    /// cooperative pool's few threads (which may serve a gateway under test in this process) must
    /// not wait with them.
    public static func run(
        _ executable: String, _ arguments: [String] = [], environment: [String: String]? = nil, directory: String? = nil,
        input: Input = .null, output: Output = .capture, errors: Output = .sameAsOutput, name: String? = nil, timeout: Duration
    ) async throws -> ChildProcess {
        let child = try await withCheckedThrowingContinuation { (started: CheckedContinuation<ChildProcess, any Error>) in
            let thread = Thread {
                started.resume(
                    with: Result {
                        try ChildProcess(
                            executable, arguments, environment: environment, directory: directory, input: input, output: output,
                            errors: errors, name: name)
                    })
            }
            thread.start()
        }
        guard await child.wait(timeout: timeout) == nil else { return child }
        child.terminate(signal: SIGKILL)
        await child.wait()
        try Task.checkCancellation()
        throw Failure.timedOut(child.name, timeout)
    }

    /// Like ``wait()``, but nil as soon as the task is cancelled.
    private func waitUnlessCancelled() async -> Int32? {
        let id = state.withLock { $0.newWaiter() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in keep(.task(continuation), id: id) }
        } onCancel: {
            self.state.withLock { $0.cancel(id) }?.resume(nil)
        }
    }

    /// Keeps `waiter` until the child ends, or resumes it now when it has ended (or its task was
    /// cancelled already).
    private func keep(_ waiter: Waiter, id: Int) {
        let now: Int32?? = state.withLock { state in
            if state.keep(waiter, id: id) { return .none }
            return .some(state.status)
        }
        if let now { waiter.resume(now) }
    }

    /// The waiting thread: blocks until the child ends, reaps it, reads what was captured, then
    /// wakes every waiter.
    ///
    /// The end is first seen without reaping (`waitid` with `WNOWAIT`): the child stays a zombie,
    /// holding its process id, until it is reaped under the state's lock, so ``terminate(signal:)``
    /// (which signals under that lock only while it is not reaped) never reaches a reused id.
    private func watch(_ files: CaptureFiles) {
        var info = siginfo_t()
        var seen: Int32
        repeat { seen = waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) } while seen == -1 && errno == EINTR
        let status = state.withLock { state in
            state.reaped = true
            var raw: Int32 = 0
            var reaped: pid_t
            repeat { reaped = waitpid(pid, &raw, seen == 0 ? 0 : WNOHANG) } while reaped == -1 && errno == EINTR
            return reaped == pid ? Self.exitStatus(raw) : Self.lostStatus
        }
        let (output, errors) = files.read()
        files.remove()
        let waiters = state.withLock { state in
            state.status = status
            state.output = output
            state.errors = errors
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume(status) }
    }

    /// A `waitpid` status as a shell tells it: the exit code, or 128 + the signal.
    static func exitStatus(_ raw: Int32) -> Int32 {
        let signal = raw & 0x7f
        return signal == 0 ? (raw >> 8) & 0xff : 128 + signal
    }
}
