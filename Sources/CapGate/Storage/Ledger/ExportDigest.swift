import Crypto

/// The bytes an export would write, counted and hashed (SHA-256) as they come, kept in a 64 KiB
/// buffer at most: what retention compares with a recorded export (``LedgerRetention``) without
/// writing a file. ``ExportFile`` hashes what it writes the same way.
struct ExportDigest {
    /// The bytes not hashed yet: append to it, then call ``flushIfFull()``.
    var buffer: [UInt8] = []
    private var hasher = SHA256()
    private var bytes: Int64 = 0

    init() {
        buffer.reserveCapacity(ExportFile.bufferSize + 4096)
    }

    mutating func flushIfFull() {
        if buffer.count >= ExportFile.bufferSize { flush() }
    }

    private mutating func flush() {
        hasher.update(data: buffer)
        bytes += Int64(buffer.count)
        buffer.removeAll(keepingCapacity: true)
    }

    /// The count of bytes and their SHA-256, lower-case hex (as `ledger_exports` records it).
    mutating func finish() -> (bytes: Int64, sha256: String) {
        flush()
        return (bytes, Self.hex(hasher.finalize()))
    }

    static func hex(_ digest: SHA256.Digest) -> String {
        digest.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}
