import Foundation
import Hummingbird
// `ByteBuffer(takingOwnershipOf:allocator:)` (``BodyCollector/buffer(capacity:)``): the only way
// to a buffer of exactly a body's size (every buffer NIO allocates itself is rounded up to a power
// of two: 256 KiB for a body of 128 KiB and a few bytes).
@_spi(CustomByteBufferAllocator) import NIOCore

/// The request body read within its budgets.
extension CallReader {
    /// The whole body, up to `proxy.maxBodyBytes` (413 above, from a declared `Content-Length`
    /// before a byte is read), within the body budget shared by all calls (503 `overloaded_error`
    /// when it is spent). The budget counts bytes received as they arrive, never a declared length:
    /// a client that declares 32 MB and sends a byte at a time holds one byte of it (and a buffer
    /// of at most twice what it sent). All of it is released when the read ends. The body comes
    /// back in a buffer of about its own size, whatever chunks it arrived in (``BodyCollector``).
    func readBody(_ request: Request, company: UUID) async throws -> ByteBuffer {
        try await Self.readBody(request, company: company, maxBodyBytes: maxBodyBytes, budget: bodyBudget, share: bodyShare)
    }

    /// ``readBody(_:company:)`` with its limits given (for the unit tests).
    static func readBody(
        _ request: Request, company: UUID, maxBodyBytes: Int, budget bodyBudget: BodyBudget, share bodyShare: CompanyShare
    ) async throws -> ByteBuffer {
        let declared = request.headers[.contentLength].flatMap(Int.init)
        if let declared, declared > maxBodyBytes {
            throw GatewayError.tooLarge(limit: maxBodyBytes)
        }
        var reserved = 0
        defer {
            bodyBudget.release(reserved)
            bodyShare.give(reserved, for: company)
        }
        func reserve(upTo total: Int) throws {
            guard total > reserved else { return }
            guard bodyShare.take(total - reserved, for: company) else {
                throw GatewayError.overloaded(
                    "Your company is sending as many request bodies at once as its share of this gateway allows, so the call was not forwarded. Try again shortly."
                )
            }
            guard bodyBudget.reserve(total - reserved) else {
                bodyShare.give(total - reserved, for: company)
                throw GatewayError.overloaded(
                    "The gateway is reading as many request bodies as it can hold right now, so the call was not forwarded. Try again shortly."
                )
            }
            reserved = total
        }
        // Into one buffer no larger than the body (``BodyCollector``).
        var body = BodyCollector(declared: declared, limit: maxBodyBytes)
        for try await chunk in request.body {
            let total = body.count + chunk.readableBytes
            guard total <= maxBodyBytes else { throw GatewayError.tooLarge(limit: maxBodyBytes) }
            try reserve(upTo: total)
            body.append(chunk)
        }
        return body.finish()
    }
}

/// A request body gathered from the chunks the HTTP decoder hands on, into one buffer that holds
/// no more than the body (issue #51: memory per call in flight bounded by its body).
///
/// - A body in one chunk is kept as that chunk (no copy) when the storage behind it is about the
///   body's size; a chunk is a slice of a socket read's buffer, which may be four times larger
///   than the body or hold the request's head too, so such a body is copied into a buffer of its
///   exact size and the read buffer goes back to NIO's pool.
/// - A body in several chunks is copied into a buffer this collector allocates: at most twice the
///   bytes received so far, never above `limit` (`proxy.maxBodyBytes`), and never above the
///   declared `Content-Length` once half of it has arrived, so a body that declares its length
///   ends in a buffer of exactly that length. A client that declares a large length and sends
///   little holds no more than twice what it sent, as the body budget (which counts bytes
///   received) assumes.
/// - A body without a declared length (`transfer-encoding: chunked`) grows the same way and,
///   if it ends with more room than `slack(for:)` allows, is copied once into a buffer of its size.
///
/// NIO's HTTP decoder hands on exactly `Content-Length` bytes (whatever follows them is the next
/// request), so a body never outgrows its declared length here; if one did, it would be kept
/// whole and grown as an undeclared one is.
struct BodyCollector {
    /// The declared `Content-Length`, if any.
    let declared: Int?
    /// `proxy.maxBodyBytes`: no buffer is allocated above it.
    let limit: Int
    private(set) var body = ByteBuffer()
    /// Whether `body` is a buffer this collector allocated (written on in place), not a chunk.
    private var allocated = false

    init(declared: Int?, limit: Int) {
        self.declared = declared
        self.limit = limit
    }

    /// The bytes received so far.
    var count: Int { body.readableBytes }

    mutating func append(_ chunk: ByteBuffer) {
        guard chunk.readableBytes > 0 else { return }
        guard body.readableBytes > 0 else {
            body = chunk
            return
        }
        let needed = body.readableBytes + chunk.readableBytes
        if !allocated || chunk.readableBytes > body.writableBytes {
            var grown = Self.buffer(capacity: Self.capacity(for: needed, declared: declared, limit: limit))
            grown.writeImmutableBuffer(body)
            body = grown
            allocated = true
        }
        body.writeImmutableBuffer(chunk)
    }

    /// The whole body, in a buffer whose storage exceeds it by no more than ``slack(for:)``.
    mutating func finish() -> ByteBuffer {
        if body.storageCapacity - body.readableBytes > Self.slack(for: body.readableBytes) {
            var exact = Self.buffer(capacity: body.readableBytes)
            exact.writeImmutableBuffer(body)
            body = exact
        }
        return body
    }

    /// The room a finished body may keep beyond its bytes: an eighth of them.
    static func slack(for bytes: Int) -> Int { bytes / 8 }

    /// The capacity to grow to when `needed` bytes must fit: twice them (so a body in many chunks
    /// is copied a logarithmic number of times), but not above `limit`, nor above the declared
    /// length while it is not exceeded.
    static func capacity(for needed: Int, declared: Int?, limit: Int) -> Int {
        var target = needed > limit / 2 ? limit : 2 * needed
        if let declared, declared >= needed { target = min(target, declared) }
        return max(target, needed)
    }

    /// An empty buffer of exactly `capacity` bytes (NIO's own allocation would round it up to a
    /// power of two). Its memory comes from `malloc`, which the default `ByteBufferAllocator`
    /// frees it with.
    static func buffer(capacity: Int) -> ByteBuffer {
        guard capacity > 0, let memory = malloc(capacity) else { return ByteBuffer() }
        return ByteBuffer(
            takingOwnershipOf: UnsafeMutableRawBufferPointer(start: memory, count: capacity), allocator: ByteBufferAllocator(),
            readerIndex: 0, writerIndex: 0)
    }
}
