import Foundation
import Hummingbird
import NIOCore

/// A 2xx answer streamed to the client as it arrives. Its token counts are captured on the way
/// and settled, and its bytes kept for `Idempotency-Key` retries, inside the body writer: it runs
/// after the handler returned. The charge stands once the provider answered 2xx, even if the
/// client leaves; the provider's stream is then read on for up to `drain` (`costs.drainSeconds`)
/// to learn the call's usage (SPEC §11; a stream that ends later is charged its hold), and for as
/// long as the answer is being kept for retries. The drain is measured as chunks arrive: a
/// provider that goes silent is bounded by `upstream.idleTimeout` instead.
struct StreamedAnswer: Sendable {
    let stream: UpstreamStream
    let status: Int
    let contentType: String?
    let charge: Charge?
    let keeper: AnswerKeeper?
    let maxKept: Int
    let ticket: ShareTicket
    var drain: Duration = .seconds(60)

    func responseBody(contentLength: Int?) -> ResponseBody {
        ResponseBody(contentLength: contentLength) { writer in
            defer { ticket.release() }
            var failure: (any Error)?
            var upstreamBroke = false
            var capture = UsageCapture(contentType: contentType)
            var recorder = keeper.map { _ in AnswerRecorder(limit: maxKept) }
            var drainUntil: ContinuousClock.Instant?
            /// After the client left: read on while the usage is wanted and the drain lasts, or
            /// while the answer is being kept for a retry.
            func readsOn() -> Bool {
                recorder?.bytes != nil || (charge != nil && drainUntil.map { ContinuousClock.now < $0 } ?? false)
            }
            do {
                for try await chunk in stream {
                    capture.feed(chunk)
                    recorder?.record(chunk)
                    guard failure == nil else {
                        if !readsOn() { break }
                        continue
                    }
                    do {
                        try await writer.write(chunk)
                    } catch {
                        failure = error
                        // The call's slot stays taken while the provider's stream is read on:
                        // it is freed by the settlement below, once the stream is drained or
                        // cut (SPEC §14), so a user who opens and drops streams never has more
                        // calls running at the provider than its limit.
                        drainUntil = ContinuousClock.now + drain
                        if !readsOn() { break }
                    }
                }
            } catch {
                failure = failure ?? error
                upstreamBroke = true
            }
            capture.finish()
            // Queued before the answer ends, so a ledger read after it finds the tokens; a slot is
            // free before the client sees the answer end (SPEC §14).
            charge?.settle(status: status, usage: capture)
            // Kept before the answer's last byte goes out: a retry sent after it finds it.
            await keeper?.keep(status: status, contentType: contentType, body: upstreamBroke ? nil : recorder?.bytes)
            if let failure { throw failure }
            try await writer.finish(nil)
        }
    }
}
