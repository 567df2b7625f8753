import Foundation
import Hummingbird
import NIOCore

/// A 2xx answer streamed to the client as it arrives. Its token counts are captured on the way
/// and settled, and its bytes kept for `Idempotency-Key` retries, inside the body writer: it runs
/// after the handler returned. The charge stands once the provider answered 2xx, even if the
/// client leaves; the provider's stream is read on after that only while the answer is being kept.
struct StreamedAnswer: Sendable {
    let stream: UpstreamStream
    let status: Int
    let contentType: String?
    let charge: Charge?
    let keeper: AnswerKeeper?
    let maxKept: Int
    let ticket: ShareTicket

    func responseBody(contentLength: Int?) -> ResponseBody {
        ResponseBody(contentLength: contentLength) { writer in
            defer { ticket.release() }
            var failure: (any Error)?
            var upstreamBroke = false
            var capture = UsageCapture(contentType: contentType)
            var recorder = keeper.map { _ in AnswerRecorder(limit: maxKept) }
            do {
                for try await chunk in stream {
                    capture.feed(chunk)
                    recorder?.record(chunk)
                    guard failure == nil else {
                        // The client left: read on only while the answer is being kept for a retry.
                        if recorder?.bytes == nil { break }
                        continue
                    }
                    do {
                        try await writer.write(chunk)
                    } catch {
                        failure = error
                        if recorder?.bytes == nil { break }
                    }
                }
            } catch {
                failure = failure ?? error
                upstreamBroke = true
            }
            capture.finish()
            // Queued before the answer ends, so a ledger read after it finds the tokens.
            charge?.settle(status: status, usage: capture)
            // Kept before the answer's last byte goes out: a retry sent after it finds it.
            await keeper?.keep(status: status, contentType: contentType, body: upstreamBroke ? nil : recorder?.bytes)
            if let failure { throw failure }
            try await writer.finish(nil)
        }
    }
}
