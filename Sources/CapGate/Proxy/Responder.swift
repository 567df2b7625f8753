import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1

/// Step 4 of a metered call: passes the provider's answer back. A 2xx keeps the charge: a small
/// answer of known length goes out whole with its head, anything else streams through as it
/// arrives while token counts are captured, then settled from inside the body writer (it runs
/// after the handler returns). Any other status is given back first and passed through as the
/// provider sent it, so SDKs show the provider's own error.
struct Responder: Sendable {
    let metering: MeteringStore
    /// `proxy.idempotencyMaxBytes`: the largest answer kept for `Idempotency-Key` retries.
    let idempotencyMaxBytes: Int
    /// `costs.drainSeconds`: how long a stream is read on after its client left, for its usage.
    var drain: Duration = .seconds(60)

    func respond(
        _ answer: Forwarder.Answer, to call: Call, _ admitted: AdmittedCall, logger: Logger, record: RequestRecord
    ) async
        -> Response
    {
        let head = answer.response.head
        let contentLength = head.headers.first(name: "content-length").flatMap(Int.init)
        var headers = Self.returnedHeaders(head.headers)
        guard (200..<300).contains(answer.status) else {
            var state = admitted.state
            if let charge = admitted.charge, await charge.refund(status: answer.status, reason: .upstreamStatus, logger: logger) {
                record.update { $0.decision = "refunded" }
                state = state.refunded(units: admitted.units)
            }
            headers.append(contentsOf: state.rateLimitHeaders())
            return Response(
                status: .init(code: answer.status), headers: headers,
                body: Self.passThrough(answer.response.body, length: contentLength, ticket: answer.ticket))
        }
        headers.append(contentsOf: admitted.state.rateLimitHeaders())
        let keeper = admitted.idempotencyKey.map {
            AnswerKeeper(metering: metering, user: admitted.user, key: $0, requestID: call.requestID, logger: logger)
        }
        let contentType = head.headers.first(name: "content-type")
        switch answer.response.body {
        case .whole(let whole, let failure):
            answer.ticket.release()
            var capture = UsageCapture(contentType: contentType)
            capture.read(whole: whole)
            admitted.charge?.settle(status: answer.status, usage: capture)
            await keeper?.keep(
                status: answer.status, contentType: contentType,
                body: failure == nil && whole.readableBytes <= idempotencyMaxBytes ? whole : nil)
            return Response(
                status: .init(code: answer.status), headers: headers, body: Self.body(whole, failure: failure, length: contentLength))
        case .stream(let stream):
            let body = StreamedAnswer(
                stream: stream, status: answer.status, contentType: contentType, charge: admitted.charge, keeper: keeper,
                maxKept: idempotencyMaxBytes, ticket: answer.ticket, drain: drain)
            return Response(status: .init(code: answer.status), headers: headers, body: body.responseBody(contentLength: contentLength))
        }
    }

    /// The provider's fields that go back to the tenant (``ForwardedFields``).
    static func returnedHeaders(_ upstream: NIOHTTP1.HTTPHeaders) -> HTTPFields {
        var headers = HTTPFields()
        headers.reserveCapacity(upstream.count + 3)
        let options = ForwardedFields.connectionOptions(upstream["connection"])
        for (name, value) in upstream where ForwardedFields.forwardsResponseHeader(name.lowercased(), connectionOptions: options) {
            if let fieldName = HTTPField.Name(name) { headers.append(HTTPField(name: fieldName, value: value)) }
        }
        return headers
    }

    /// A non-2xx body, passed on as it comes.
    static func passThrough(_ body: UpstreamBody, length: Int?, ticket: ShareTicket) -> ResponseBody {
        switch body {
        case .whole(let whole, let failure):
            ticket.release()
            return Self.body(whole, failure: failure, length: length)
        case .stream(let stream):
            return ResponseBody(contentLength: length) { writer in
                defer { ticket.release() }
                for try await chunk in stream { try await writer.write(chunk) }
                try await writer.finish(nil)
            }
        }
    }

    /// A collected body: head and body in one write; a body the provider broke off is passed on
    /// as far as it came and the connection then closed, exactly as when streaming.
    static func body(_ whole: ByteBuffer, failure: (any Error)?, length: Int?) -> ResponseBody {
        guard let failure else { return ResponseBody(byteBuffer: whole) }
        return ResponseBody(contentLength: length) { writer in
            try await writer.write(whole)
            throw failure
        }
    }
}
