import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A write the database could not take when it was due, kept until it can: each one is
/// idempotent, so replaying it after a partial success changes nothing.
enum PendingWrite: Codable, Sendable, Equatable {
    /// A failed attempt's charge to give back (`capgate_refund`).
    case refund(company: UUID, ledger: Int64, requestID: String, status: Int?)
    /// Usage and status of a charge that stands (`capgate_settle_batch`). The cache counts and
    /// `known` are nil in entries written before cost budgets (their usage is known when both
    /// token counts are).
    case settle(
        company: UUID, ledger: Int64, status: Int32, inputTokens: Int64?, outputTokens: Int64?, cacheWrite5m: Int64?,
        cacheWrite1h: Int64?, cacheRead: Int64?, known: Bool?)
    /// The answer of an `Idempotency-Key`'s successful attempt (`capgate_idempotency_answer`).
    case answer(company: UUID, user: UUID, key: String, requestID: String, status: Int, contentType: String?, body: Data?)
    /// An admission whose outcome is unknown: its charges are looked up by request id and given back.
    case giveBack(keyHashes: [Data], companies: [UUID], requestIDs: [String], since: Date)
    /// The same, put here the moment the outcome is known to be unknown and done once `due` has
    /// passed (the admission's deadline, when its statement has ended either way): a gateway
    /// that stops before then leaves it for its next start instead of forgetting it.
    case giveBackWhenDue(keyHashes: [Data], companies: [UUID], requestIDs: [String], since: Date, due: Date)
}

/// The local spool (`spool.directory`): a write the database cannot take is put here, fsynced,
/// before the caller is answered, and replayed at start, while running and at shutdown until the
/// database takes it (``SpoolReplayer``). So a refund, give-back, settlement or kept answer is
/// not lost when the gateway restarts or crashes while PostgreSQL is away.
///
/// One file per write (`<time>-<random>.json`: the database it belongs to and the write),
/// written to a temporary name, fsynced, renamed and the folder fsynced. A gateway replays only
/// the entries of its own database, so a folder shared by mistake never applies a write to
/// another database. Each gateway process should have a folder of its own.
public final class Spool: Sendable {
    struct Entry: Codable, Sendable {
        var database: String
        var write: PendingWrite
    }

    let directory: String
    /// Which database the entries belong to (`host:port/name` of `database.url`).
    let database: String
    let logger: Logger
    private let depthValue = Atomic<Int>(0)

    public init(directory: String, database: String, logger: Logger) throws {
        self.directory = directory
        self.database = database
        self.logger = logger
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        depthValue.store(Self.names(in: directory).count, ordering: .relaxed)
        GatewayMetrics.spoolDepth(depth)
    }

    /// Entries waiting in the folder (all databases).
    public var depth: Int { depthValue.load(ordering: .relaxed) }

    /// Puts `write` in the spool, durably, before returning.
    func put(_ write: PendingWrite) throws {
        try put(write, note: "a write the database could not take was spooled")
    }

    /// ``put(_:)`` logging `note` (at warning) instead of the default.
    func put(_ write: PendingWrite, note: String) throws {
        let data = try JSONEncoder().encode(Entry(database: database, write: write))
        let stamp = String(format: "%016llx", UInt64(Date().timeIntervalSince1970 * 1_000_000))
        let name = "\(stamp)-\(UInt32.random(in: .min ... .max)).json"
        let temporary = directory + "/." + name + ".tmp"
        guard FileManager.default.createFile(atPath: temporary, contents: nil) else { throw SpoolError.cannotWrite(temporary) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: temporary))
        try handle.write(contentsOf: data)
        try handle.synchronize()
        try handle.close()
        guard rename(temporary, directory + "/" + name) == 0 else { throw SpoolError.cannotWrite(name) }
        Self.syncFolder(directory)
        let depth = depthValue.wrappingAdd(1, ordering: .relaxed).newValue
        GatewayMetrics.spoolDepth(depth)
        logger.warning("\(note)", metadata: ["spool_depth": "\(depth)"])
    }

    /// This database's entries, oldest first (an unreadable file is moved aside as `.bad`).
    func pending() -> [(name: String, write: PendingWrite)] {
        Self.names(in: directory).compactMap { name in
            let path = directory + "/" + name
            guard let data = FileManager.default.contents(atPath: path), let entry = try? JSONDecoder().decode(Entry.self, from: data)
            else {
                logger.error("an unreadable spool entry was moved aside", metadata: ["file": "\(name)"])
                _ = rename(path, path + ".bad")
                depthValue.wrappingSubtract(1, ordering: .relaxed)
                return nil
            }
            return entry.database == database ? (name, entry.write) : nil
        }
    }

    /// Forgets an entry the database has taken.
    func remove(_ name: String) {
        guard unlink(directory + "/" + name) == 0 else { return }
        Self.syncFolder(directory)
        GatewayMetrics.spoolDepth(depthValue.wrappingSubtract(1, ordering: .relaxed).newValue)
    }

    static func names(in directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }
            .sorted()
    }

    static func syncFolder(_ directory: String) {
        let fd = open(directory, O_RDONLY)
        guard fd >= 0 else { return }
        _ = fsync(fd)
        _ = close(fd)
    }

    enum SpoolError: Error {
        case cannotWrite(String)
    }
}
