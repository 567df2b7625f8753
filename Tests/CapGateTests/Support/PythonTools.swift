import CapGate
import CapGateDev
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The Python tools some tests run (the official Anthropic SDK, schemathesis, PyYAML), installed
/// by the tests themselves so that `swift test` alone is enough on a fresh machine.
///
/// On first use in a test process it makes a virtual environment at `.build/python-tools/venv`
/// with `python3 -m venv` and installs `requirements` into it with pip. A stamp file in the
/// environment records the pins and the base interpreter once the install has succeeded; a later
/// run whose stamp matches reuses the environment without touching the network, and a change of
/// pins (or of `python3`) rebuilds it. Two test processes at once are kept apart by an exclusive
/// `flock` on `.build/python-tools/lock`; within one process the work runs once (a `static let`
/// is initialised once, under the runtime's lock).
enum PythonTools {
    /// Exact pins, checked with Python 3.11.
    static let requirements = [
        "anthropic==2.13.0", "PyYAML==6.0.4", "schemathesis==4.32.5", "standardwebhooks==1.1.0", "selenium==4.51.0",
        "app-store-server-library==3.1.2",
    ]

    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let directory = root.appendingPathComponent(".build/python-tools")
    static let venv = directory.appendingPathComponent("venv")
    static let stamp = venv.appendingPathComponent("capgate-requirements.txt")

    /// A failure to install, told in one line that names the command to run.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// The path of the environment's `python`, installing the tools first if needed.
    static func python() async throws -> String {
        try await installation.value
    }

    private static let installation = Task<String, Error> {
        try await withCheckedThrowingContinuation { continuation in
            // Blocking work (flock, pip) on a thread of its own, never on the cooperative pool.
            let thread = Thread { continuation.resume(with: Result { try installBlocking() }) }
            thread.start()
        }
    }

    private static func installBlocking() throws -> String {
        let python = venv.appendingPathComponent("bin/python").path
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let lock = open(directory.appendingPathComponent("lock").path, O_CREAT | O_RDWR | O_CLOEXEC, 0o644)
        guard lock >= 0 else { throw Failure(description: "cannot open \(directory.path)/lock (errno \(errno))") }
        defer { close(lock) }
        while flock(lock, LOCK_EX) != 0 {
            guard errno == EINTR else { throw Failure(description: "cannot lock \(directory.path)/lock (errno \(errno))") }
        }
        defer { flock(lock, LOCK_UN) }

        let (found, base) = run("python3", ["-c", "import sys; print(sys.version.split()[0], sys.base_prefix)"])
        guard found == 0 else {
            throw Failure(description: "python3 is needed for the SDK and OpenAPI tests: apt-get install -y python3 python3-venv")
        }
        let wanted = (["python \(base.trimmingCharacters(in: .whitespacesAndNewlines))"] + requirements).joined(separator: "\n") + "\n"
        if FileManager.default.isExecutableFile(atPath: python), (try? String(contentsOf: stamp, encoding: .utf8)) == wanted {
            return python
        }

        let (hasVenv, _) = run("python3", ["-c", "import venv, ensurepip"])
        guard hasVenv == 0 else {
            throw Failure(description: "python3 cannot make a virtual environment (no ensurepip): apt-get install -y python3-venv")
        }
        try? FileManager.default.removeItem(at: venv)
        let (made, madeOutput) = run("python3", ["-m", "venv", venv.path])
        guard made == 0 else {
            throw Failure(description: "python3 -m venv \(venv.path) failed (\(lastLine(madeOutput))): apt-get install -y python3-venv")
        }
        let pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"] + requirements
        let (installed, installOutput) = run(python, pip)
        guard installed == 0 else {
            let command = ([python] + pip).joined(separator: " ")
            throw Failure(description: "pip could not install the test tools (\(lastLine(installOutput))); run: \(command)")
        }
        try wanted.write(to: stamp, atomically: true, encoding: .utf8)
        return python
    }

    private static func lastLine(_ output: String) -> String {
        output.split(whereSeparator: \.isNewline).last.map(String.init) ?? "no output"
    }

    /// Runs `executable` (looked up in `PATH`) in the repository root to its end, blocking this
    /// thread (the installation's own); its exit status, and its output and errors together.
    private static func run(_ executable: String, _ arguments: [String]) -> (Int32, String) {
        // A virtual environment the caller has active must not steer the base interpreter or pip.
        var environment = ProcessInfo.processInfo.environment
        for name in ["VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "PIP_USER"] { environment[name] = nil }
        let child: ChildProcess
        do {
            child = try ChildProcess(
                "/usr/bin/env", [executable] + arguments, environment: environment, directory: root.path, name: executable)
        } catch {
            return (127, "\(error)")
        }
        return (child.waitUntilExit(), child.outputText)
    }
}
