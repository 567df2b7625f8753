import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

extension ChildProcess {
    /// Held while this process starts a program (every start goes through ``ChildProcess``, and
    /// anything else in the process that starts one must take it too): Foundation's
    /// `Process.run()` crashed once (a bad pointer in its copy of the arguments) while other
    /// threads were starting programs and marking descriptors close-on-exec, so programs are
    /// started one at a time. Starting is quick; waiting is not under the lock.
    ///
    /// Every descriptor of ours is marked close-on-exec under it, and the child closes every
    /// descriptor above 2 before it runs: a server that a child starts (PostgreSQL under
    /// `pg_ctl`) inherits the descriptors its parent had, and would otherwise hold ours (a
    /// connection it holds never sees its peer close) for as long as it runs.
    public static let spawnLock = Mutex<Void>(())

    /// The temporary files that stand for captured output.
    struct CaptureFiles: Sendable {
        let output: String?
        let errors: String?

        init(output: Output, errors: Output) {
            let base = NSTemporaryDirectory() + "capgate-child-" + UUID().uuidString
            self.output = output == .capture ? base + ".out" : nil
            self.errors = errors == .capture ? base + ".err" : nil
        }

        /// What was captured (empty where nothing was).
        func read() -> (output: [UInt8], errors: [UInt8]) {
            func bytes(_ path: String?) -> [UInt8] { path.flatMap { FileManager.default.contents(atPath: $0) }.map { [UInt8]($0) } ?? [] }
            return (bytes(output), bytes(errors))
        }

        func remove() {
            for path in [output, errors].compactMap({ $0 }) { try? FileManager.default.removeItem(atPath: path) }
        }
    }

    /// The child's descriptors 0, 1 and 2.
    struct Streams {
        let input: Input
        let output: Output
        let errors: Output
        let files: CaptureFiles

        /// Opens them in the child: standard input from `inputPath`.
        func add(to actions: inout posix_spawn_file_actions_t, inputPath: String) {
            posix_spawn_file_actions_addopen(&actions, 0, inputPath, O_RDONLY, 0)
            Self.add(output, descriptor: 1, capture: files.output, to: &actions)
            Self.add(errors, descriptor: 2, capture: files.errors, to: &actions)
        }

        static func add(_ output: Output, descriptor: Int32, capture: String?, to actions: inout posix_spawn_file_actions_t) {
            switch output {
            case .null: posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", O_WRONLY, 0)
            case .inherit: break
            case .file(let path): posix_spawn_file_actions_addopen(&actions, descriptor, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            case .capture:
                posix_spawn_file_actions_addopen(&actions, descriptor, capture ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            case .sameAsOutput: if descriptor != 1 { posix_spawn_file_actions_adddup2(&actions, 1, descriptor) }
            }
        }

        /// The file standard input is read from; `.bytes` are written to a temporary file first
        /// (the caller removes it once the child has started: the child has it open by then).
        func inputPath(name: String) throws(Failure) -> String {
            switch input {
            case .null: return "/dev/null"
            case .file(let path): return path
            case .bytes(let bytes):
                let path = NSTemporaryDirectory() + "capgate-child-" + UUID().uuidString + ".in"
                guard FileManager.default.createFile(atPath: path, contents: Data(bytes), attributes: [.posixPermissions: 0o600]) else {
                    throw .couldNotStart(name, "cannot write its input to \(path)")
                }
                return path
            }
        }
    }

    /// Starts the program with posix_spawn (a bare name looked up in this process's `PATH`),
    /// its descriptors as `streams` says, its signals at their defaults and none blocked (not
    /// what this process ignores or blocks); its process id.
    static func spawn(
        _ executable: String, _ arguments: [String], environment: [String: String]?, directory: String?, streams: Streams,
        name: String
    ) throws(Failure) -> pid_t {
        let inputPath = try streams.inputPath(name: name)
        defer { if case .bytes = streams.input { try? FileManager.default.removeItem(atPath: inputPath) } }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        streams.add(to: &actions, inputPath: inputPath)
        if let directory, !changeDirectory(&actions, to: directory) {
            throw .couldNotStart(name, "this C library cannot set a child's working directory (\(directory))")
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        defaultSignals(&attributes)

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for arg in argv { free(arg) } }
        let envp = environment.map { variables in variables.map { strdup($0.key + "=" + $0.value) } + [nil] }
        defer { for variable in envp ?? [] { free(variable) } }
        var pid = pid_t()
        let spawned = spawnLock.withLock { _ in
            markDescriptorsCloseOnExec()
            closeOtherDescriptors(&actions)
            func start(_ variables: UnsafePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
                executable.contains("/")
                    ? posix_spawn(&pid, executable, &actions, &attributes, argv, variables)
                    : posix_spawnp(&pid, executable, &actions, &attributes, argv, variables)
            }
            guard let envp else { return start(environ) }
            return envp.withUnsafeBufferPointer { start($0.baseAddress!) }
        }
        guard spawned == 0 else { throw .couldNotStart(name, String(cString: strerror(spawned))) }
        return pid
    }

    /// Every signal at its default in the child, and none blocked.
    static func defaultSignals(_ attributes: inout posix_spawnattr_t) {
        var all = sigset_t()
        sigfillset(&all)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
    }

    /// Makes the child change to `directory` before it runs (glibc's
    /// `posix_spawn_file_actions_addchdir_np`, looked up at run time as below); false without it.
    static func changeDirectory(_ actions: inout posix_spawn_file_actions_t, to directory: String) -> Bool {
        typealias AddChdir = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
        guard let symbol = dlsym(nil, "posix_spawn_file_actions_addchdir_np") else { return false }
        return directory.withCString { unsafeBitCast(symbol, to: AddChdir.self)(&actions, $0) } == 0
    }

    /// Closes every descriptor above 2 in the child (glibc's `posix_spawn_file_actions_addclosefrom_np`,
    /// looked up at run time: Swift's Glibc module does not declare it). Marking descriptors
    /// close-on-exec leaves a window: one another thread opens between the marking and the spawn
    /// would still reach the child, and a connection it holds never sees its peer close.
    static func closeOtherDescriptors(_ actions: inout posix_spawn_file_actions_t) {
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return }
        _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
    }

    static func markDescriptorsCloseOnExec() {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return }
        for name in names {
            guard let fd = Int32(name), fd > 2 else { continue }
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0 { _ = fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
        }
    }
}
