import Foundation
import Hummingbird
import NIOCore

/// The request body read within its budgets.
extension CallReader {
    /// The whole body, up to `proxy.maxBodyBytes` (413 above, from a declared `Content-Length`
    /// before a byte is read), within the body budget shared by all calls (503 `overloaded_error`
    /// when it is spent). The budget counts bytes received as they arrive, never a declared length:
    /// a client that declares 32 MB and sends a byte at a time holds one byte of it. All of it is
    /// released when the read ends.
    func readBody(_ request: Request, company: UUID) async throws -> ByteBuffer {
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
        // The first chunk is the buffer the rest is added to (a body in one chunk is not copied).
        var body = ByteBuffer()
        for try await chunk in request.body {
            let total = body.readableBytes + chunk.readableBytes
            guard total <= maxBodyBytes else { throw GatewayError.tooLarge(limit: maxBodyBytes) }
            try reserve(upTo: total)
            if body.readableBytes == 0 {
                body = chunk
            } else {
                body.writeImmutableBuffer(chunk)
            }
        }
        return body
    }
}
