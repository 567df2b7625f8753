import Crypto
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A file written once, front to back, in constant memory: bytes gather in a 64 KiB buffer that
/// is hashed (SHA-256) and written out whenever it fills. They go to `path.partial`, created
/// only if absent; ``finish()`` syncs it, gives it its name, which no other file may have taken
/// meanwhile, and writes `path.sha256`. ``abandon()`` removes the partial file.
///
/// The writes block their thread: this serves a one-shot command, whose only other work is
/// reading the rows it writes.
struct ExportFile {
    /// Why a file could not be written: the path and the system's reason.
    struct Failure: Error, CustomStringConvertible {
        let path: String
        let reason: String

        init(_ path: String, errno code: Int32) {
            self.path = path
            self.reason = String(cString: strerror(code))
        }

        var description: String { "cannot write \(path): \(reason)" }
    }

    /// What was written.
    struct Written: Sendable {
        var bytes: Int64
        /// The SHA-256 of the bytes, lower-case hex.
        var sha256: String
    }

    static let bufferSize = 64 * 1024

    let path: String
    var partialPath: String { path + ".partial" }
    /// The bytes not written out yet: append to it, then call ``flushIfFull()``.
    var buffer: [UInt8] = []
    /// -1 once closed.
    private var descriptor: Int32
    private var hasher = SHA256()
    private var written: Int64 = 0

    /// Creates `path.partial`; fails with `EEXIST` when it is there (another export, or one
    /// that was killed: its partial file is left to be removed by hand).
    init(path: String) throws {
        self.path = path
        let descriptor = open(path + ".partial", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw Failure(path + ".partial", errno: errno) }
        self.descriptor = descriptor
        buffer.reserveCapacity(Self.bufferSize + 4096)
    }

    /// Writes the buffer out once it holds 64 KiB or more.
    mutating func flushIfFull() throws {
        if buffer.count >= Self.bufferSize { try flush() }
    }

    mutating func flush() throws {
        hasher.update(data: buffer)
        try buffer.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let count = write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { throw Failure(partialPath, errno: count < 0 ? errno : EIO) }
                offset += count
            }
        }
        written += Int64(buffer.count)
        buffer.removeAll(keepingCapacity: true)
    }

    /// Writes out the rest, syncs the file and links it to `path` (failing with `EEXIST` if
    /// something took that name meanwhile), writes `path.sha256` (`HEX  name`, as `sha256sum`
    /// prints it), removes the partial name and syncs the folder.
    mutating func finish() throws -> Written {
        try flush()
        guard fsync(descriptor) == 0 else { throw Failure(partialPath, errno: errno) }
        _ = close(descriptor)
        descriptor = -1
        let hex = hasher.finalize().map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        guard link(partialPath, path) == 0 else { throw Failure(path, errno: errno) }
        do {
            try Self.writeSynced(path + ".sha256", Array("\(hex)  \(URL(fileURLWithPath: path).lastPathComponent)\n".utf8))
        } catch {
            _ = unlink(path)
            throw error
        }
        _ = unlink(partialPath)
        Self.syncFolder(of: path)
        return Written(bytes: written, sha256: hex)
    }

    /// Closes and removes the partial file (after a failure).
    mutating func abandon() {
        if descriptor >= 0 { _ = close(descriptor) }
        descriptor = -1
        _ = unlink(partialPath)
    }

    /// `bytes` to `path` (replaced if there), through a temporary name, synced.
    static func writeSynced(_ path: String, _ bytes: [UInt8]) throws {
        let temporary = path + ".partial"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw Failure(temporary, errno: errno) }
        let count = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress!, $0.count) }
        let synced = count == bytes.count && fsync(descriptor) == 0
        let code = errno
        _ = close(descriptor)
        guard synced, rename(temporary, path) == 0 else {
            let failure = Failure(path, errno: synced ? errno : (count < 0 ? code : EIO))
            _ = unlink(temporary)
            throw failure
        }
    }

    static func syncFolder(of path: String) {
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent().path
        let descriptor = open(folder, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return }
        _ = fsync(descriptor)
        _ = close(descriptor)
    }
}
