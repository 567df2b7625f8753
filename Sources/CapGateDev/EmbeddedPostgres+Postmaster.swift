import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Which process is a cluster's postmaster, checked rather than read: `postmaster.pid` outlives a
/// postmaster that was killed (`kill -9`, a crash), and its number is soon another process's
/// (this machine wraps its process ids at 32,768, in minutes under a test run). `pg_ctl stop` on
/// such a file would signal that other process and wait a minute for it to end; the dev server
/// once took that minute to stop after a failover tried by hand.
extension EmbeddedPostgres {
    /// The postmaster's process id, when `postmaster.pid` names a live process that is this
    /// cluster's postmaster: on Linux, one whose working directory is the data directory (a
    /// postmaster works in its data directory); elsewhere, one that is alive.
    public var postmasterPID: pid_t? {
        guard let pid = Self.pidFileProcess(dataDirectory) else { return nil }
        return Self.isPostmaster(pid, of: dataDirectory) ? pid : nil
    }

    /// Whether `postmaster.pid` exists but names no postmaster of this cluster (a stale file).
    var hasStalePIDFile: Bool {
        FileManager.default.fileExists(atPath: dataDirectory + "/postmaster.pid") && postmasterPID == nil
    }

    /// The first line of `data/postmaster.pid`, if any.
    static func pidFileProcess(_ data: String) -> pid_t? {
        guard let text = try? String(contentsOfFile: data + "/postmaster.pid", encoding: .utf8),
            let first = text.split(separator: "\n").first, let pid = pid_t(first.trimmingCharacters(in: .whitespaces)), pid > 0
        else { return nil }
        return pid
    }

    /// Whether process `pid` is alive and, where `/proc` shows it, works in `data`.
    static func isPostmaster(_ pid: pid_t, of data: String) -> Bool {
        #if canImport(Glibc)
            let alive = Glibc.kill(pid, 0) == 0 || errno == EPERM
        #else
            let alive = Darwin.kill(pid, 0) == 0 || errno == EPERM
        #endif
        guard alive else { return false }
        #if os(Linux)
            guard let cwd = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd") else { return false }
            return URL(fileURLWithPath: cwd).standardizedFileURL.resolvingSymlinksInPath().path
                == URL(fileURLWithPath: data).standardizedFileURL.resolvingSymlinksInPath().path
        #else
            return true
        #endif
    }

    /// Stops whatever postmaster of ours `data/postmaster.pid` names (`mode`: fast or immediate);
    /// a stale file (its process gone, or another process's now) is removed instead, so that
    /// neither `pg_ctl` nor the next start acts on a number that is no longer ours.
    static func stopIfRunning(data: String, bin: String, mode: String, asRoot: Bool) {
        guard let pid = pidFileProcess(data) else { return }
        if isPostmaster(pid, of: data) {
            _ = try? run(bin + "/pg_ctl", ["-D", data, "-m", mode, "-w", "stop"], asRoot: asRoot)
        } else {
            try? FileManager.default.removeItem(atPath: data + "/postmaster.pid")
        }
    }
}
