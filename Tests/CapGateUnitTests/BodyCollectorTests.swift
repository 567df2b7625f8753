import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import CapGate

/// A request body gathered into one buffer about its own size (Proxy/CallReader+Body.swift,
/// issue #51 item 4): exactly its declared length whatever chunks it arrived in, at most twice
/// what was received while it arrives, never above `proxy.maxBodyBytes`; a body without a
/// declared length ends within an eighth of its size; one chunk about the body's size is kept
/// without a copy. And the limits of ``CallReader/readBody(_:company:)`` as before.
@Suite("The request body's buffer")
struct BodyCollectorTests {
    /// `count` bytes of a repeating pattern (so a byte out of place is seen).
    static func bytes(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) } }

    /// `bytes` cut into chunks of the sizes given in turn (the last size repeats), each a slice
    /// of a larger buffer, as NIO's decoder hands them on (a slice of a socket read's buffer).
    static func chunks(_ bytes: [UInt8], sizes: [Int]) -> [ByteBuffer] {
        var chunks: [ByteBuffer] = []
        var start = 0
        var turn = 0
        while start < bytes.count {
            let size = min(sizes[min(turn, sizes.count - 1)], bytes.count - start)
            var read = ByteBuffer(bytes: Array(repeating: UInt8(ascii: "h"), count: 7) + bytes[start..<start + size] + [0, 0, 0])
            read.moveReaderIndex(forwardBy: 7)
            chunks.append(read.readSlice(length: size)!)
            start += size
            turn += 1
        }
        return chunks
    }

    static func collect(
        _ chunks: [ByteBuffer], declared: Int?, limit: Int = 1 << 24, check: (BodyCollector) -> Void = { _ in }
    ) -> ByteBuffer {
        var collector = BodyCollector(declared: declared, limit: limit)
        for chunk in chunks {
            collector.append(chunk)
            check(collector)
        }
        return collector.finish()
    }

    @Test("growth: twice the bytes needed, not above the limit, not above a declared length while it holds, never below what is needed")
    func capacity() {
        #expect(BodyCollector.capacity(for: 100, declared: nil, limit: 1000) == 200)
        #expect(BodyCollector.capacity(for: 600, declared: nil, limit: 1000) == 1000)
        #expect(BodyCollector.capacity(for: 100, declared: 150, limit: 1000) == 150)
        #expect(BodyCollector.capacity(for: 100, declared: 900, limit: 1000) == 200)
        #expect(BodyCollector.capacity(for: 500, declared: 900, limit: 1000) == 900)
        // More than declared (NIO's decoder never hands that on): all of it fits.
        #expect(BodyCollector.capacity(for: 300, declared: 150, limit: 1000) == 600)
        #expect(BodyCollector.capacity(for: 1200, declared: nil, limit: 1000) == 1200)
        #expect(BodyCollector.buffer(capacity: 131_113).capacity == 131_113)
        #expect(BodyCollector.buffer(capacity: 0).readableBytes == 0)
    }

    @Test("a declared body in many chunks (1 byte to 64 KiB) ends in a buffer of exactly its length, holding at most twice what arrived")
    func declaredManyChunks() {
        for (size, sizes) in [(131_113, [65_000, 65_536, 1]), (131_113, [1, 2, 3, 5_000]), (16_584, [1]), (1_158, [100, 7])] {
            let body = Self.bytes(size)
            let read = Self.collect(Self.chunks(body, sizes: sizes), declared: size) { collector in
                guard collector.count < size, collector.count > sizes[0] else { return }
                #expect(collector.body.storageCapacity <= 2 * collector.count, "\(size) \(sizes) at \(collector.count)")
            }
            #expect(read.readableBytes == size && Array(read.readableBytesView) == body, "\(size) \(sizes)")
            #expect(read.storageCapacity == size, "\(size) \(sizes)")
        }
    }

    @Test("a body without a declared length (chunked) in many chunks ends within an eighth of its size, never above the limit")
    func chunkedManyChunks() {
        for (size, sizes) in [(131_113, [4_096]), (100_000, [1, 10, 100, 1_000]), (16_584, [16_000, 584]), (3, [1])] {
            let body = Self.bytes(size)
            let read = Self.collect(Self.chunks(body, sizes: sizes), declared: nil, limit: size + 10) { collector in
                guard collector.count > sizes[0] else { return }
                #expect(collector.body.storageCapacity <= size + 10, "\(size) \(sizes)")
            }
            #expect(Array(read.readableBytesView) == body, "\(size) \(sizes)")
            #expect(read.storageCapacity - size <= size / 8, "\(size) \(sizes): \(read.storageCapacity)")
        }
    }

    @Test("one chunk about the body's size is kept as it is; one in a much larger read buffer is copied into a buffer of its size")
    func oneChunk() {
        let body = Self.bytes(16_384)
        let whole = ByteBuffer(bytes: body)
        let address = whole.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
        var kept = Self.collect([whole], declared: body.count)
        #expect(kept.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } == address)
        #expect(kept.readBytes(length: kept.readableBytes) == body)

        // A 64 KiB socket read holding the head and a 16,584-byte body.
        var read = ByteBufferAllocator().buffer(capacity: 65_536)
        read.writeString("POST /v1/messages HTTP/1.1\r\ncontent-length: 16584\r\n\r\n")
        let headLength = read.readableBytes
        read.writeBytes(Self.bytes(16_584))
        read.moveReaderIndex(forwardBy: headLength)
        let slice = read.readSlice(length: 16_584)!
        #expect(slice.storageCapacity == 65_536)
        let copied = Self.collect([slice], declared: 16_584)
        #expect(copied.storageCapacity == 16_584 && Array(copied.readableBytesView) == Self.bytes(16_584))
    }

    @Test("a client that declares 1 MB and sends bytes one by one holds a buffer of at most twice what it sent")
    func slowClient() {
        var collector = BodyCollector(declared: 1_000_000, limit: 1_000_000)
        for byte in 0..<1000 {
            collector.append(ByteBuffer(bytes: [UInt8(truncatingIfNeeded: byte)]))
            #expect(collector.body.storageCapacity <= max(2 * collector.count, 1))
        }
        #expect(collector.count == 1000)
    }

    // MARK: readBody, its limits and its budget

    static func request(_ chunks: [ByteBuffer], contentLength: Int?) -> Request {
        var fields = HTTPFields()
        if let contentLength { fields[.contentLength] = String(contentLength) }
        let head = HTTPRequest(method: .post, scheme: "http", authority: "gateway", path: "/v1/messages", headerFields: fields)
        let (stream, continuation) = AsyncStream<ByteBuffer>.makeStream()
        for chunk in chunks { continuation.yield(chunk) }
        continuation.finish()
        return Request(head: head, body: RequestBody(asyncSequence: stream))
    }

    static func read(_ request: Request, max: Int = 1 << 20, budget: BodyBudget) async throws -> ByteBuffer {
        try await CallReader.readBody(
            request, company: UUID(), maxBodyBytes: max, budget: budget, share: CompanyShare(total: budget.limit, percent: 100))
    }

    @Test("readBody: a declared body in many chunks and a chunked one come back whole, in buffers of their size; the budget is given back")
    func readBody() async throws {
        let budget = BodyBudget(limit: 1 << 20)
        let body = Self.bytes(131_113)
        let declared = try await Self.read(
            Self.request(Self.chunks(body, sizes: [65_483, 65_536]), contentLength: body.count), budget: budget)
        #expect(Array(declared.readableBytesView) == body && declared.storageCapacity == body.count)
        let chunked = try await Self.read(Self.request(Self.chunks(body, sizes: [8_192]), contentLength: nil), budget: budget)
        #expect(Array(chunked.readableBytesView) == body && chunked.storageCapacity - body.count <= body.count / 8)
        let empty = try await Self.read(Self.request([], contentLength: 0), budget: budget)
        #expect(empty.readableBytes == 0)
        #expect(budget.inUse == 0)
    }

    @Test("readBody: 413 for a declared length above proxy.maxBodyBytes before a byte, and for a chunked body growing past it")
    func readBodyLimits() async throws {
        let budget = BodyBudget(limit: 1 << 20)
        let body = Self.bytes(10_001)
        for request in [
            Self.request([], contentLength: 10_001), Self.request(Self.chunks(body, sizes: [4_000]), contentLength: nil),
        ] {
            do {
                _ = try await Self.read(request, max: 10_000, budget: budget)
                Issue.record("a body over the limit was read")
            } catch let error as GatewayError {
                #expect(error.status == .contentTooLarge)
            }
        }
        #expect(
            try await Self.read(
                Self.request(Self.chunks(Array(body.prefix(10_000)), sizes: [4_000]), contentLength: nil), max: 10_000, budget: budget
            ).readableBytes == 10_000)
        #expect(budget.inUse == 0)
    }

    // MARK: what NIO's decoder hands on (what the collector relies on)

    /// The bodies NIO's HTTP/1.1 decoder hands on for `writes` (each one socket read), the heads
    /// it read, and whether it failed (on the bytes, or at the client's close after them).
    static func decoded(_ writes: [String]) -> (bodies: [[UInt8]], heads: Int, failed: Bool) {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(HTTPRequestDecoder()))
        var bodies: [[UInt8]] = []
        var current: [UInt8] = []
        var heads = 0
        var failed = false
        func drain() {
            while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) {
                switch part {
                case .head: heads += 1
                case .body(let chunk): current += chunk.readableBytesView
                case .end:
                    bodies.append(current)
                    current = []
                }
            }
        }
        do {
            for write in writes {
                try channel.writeInbound(ByteBuffer(string: write))
                drain()
            }
            _ = try channel.finish()
        } catch {
            failed = true
        }
        drain()
        return (bodies, heads, failed)
    }

    @Test(
        "a Content-Length that lies: shorter than the body, the body ends at it and the rest is read as a next request; longer, the close fails it"
    )
    func lyingLength() {
        let head = "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        // Shorter: the first body is the declared 4 bytes; what follows is a malformed request.
        let short = Self.decoded([head + "content-length: 4\r\n\r\n" + #"{"a":1}"#])
        #expect(short.bodies == [Array(#"{"a""#.utf8)] && short.heads == 1 && short.failed)
        // Longer, then the client closes: no end, an error.
        let long = Self.decoded([head + "content-length: 100\r\n\r\n", #"{"a":1}"#])
        #expect(long.bodies.isEmpty && long.heads == 1 && long.failed)
        // Exact, in pieces: one body of its length.
        let exact = Self.decoded([head + "content-length: 7\r\n\r\n{", #""a""#, ":1}"])
        #expect(exact.bodies == [Array(#"{"a":1}"#.utf8)] && !exact.failed)
    }
}
