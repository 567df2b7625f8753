import Foundation
import Hummingbird
import Logging
import NIOCore

/// The request body read within its budgets, a collected answer written whole, and the refund
/// of a call the provider did not serve.
extension ProxyHandler {
    /// A collected body: head and body in one write; a body the provider broke off is passed on
    /// as far as it came and the connection then closed, exactly as when streaming.
    static func body(_ whole: ByteBuffer, failure: (any Error)?, length: Int?) -> ResponseBody {
        guard let failure else { return ResponseBody(byteBuffer: whole) }
        return ResponseBody(contentLength: length) { writer in
            try await writer.write(whole)
            throw failure
        }
    }

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

    /// Reports this attempt's failure before the caller is answered: the charge is given back
    /// unless another attempt at it (the same Idempotency-Key) is in flight or succeeded. Returns
    /// whether it was given back now. If the database is unavailable the caller is answered
    /// anyway (false: the outcome is not known yet) once the report is in the spool (it is
    /// idempotent and replayed until the database takes it, across restarts), so a call that
    /// failed upstream while PostgreSQL was down does not stay charged.
    @discardableResult
    func refund(user: UserIdentity, ledgerID: Int64, requestID: String, status: Int?, reason: String, logger: Logger) async -> Bool {
        do {
            guard
                try await metering.refund(companyID: user.companyID, ledgerID: ledgerID, requestID: requestID, upstreamStatus: status)
            else { return false }
            GatewayMetrics.refund(reason: reason)
            return true
        } catch DatabaseError.unavailable {
            logger.warning("refund delayed: the database is unavailable; it waits in the spool", metadata: ["ledger_id": "\(ledgerID)"])
            metering.pendingWrites.later(.refund(company: user.companyID, ledger: ledgerID, requestID: requestID, status: status))
            return false
        } catch {
            // The ledger row stays charged; `capgate verify` and the operator see it.
            logger.error("refund failed", metadata: ["ledger_id": "\(ledgerID)", "reason": "\(reason)"])
            return false
        }
    }
}
