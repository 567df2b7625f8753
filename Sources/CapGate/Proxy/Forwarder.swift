import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// Step 3 of a metered call: sends it to the provider with the provider's key, the client's
/// credentials and hop-by-hop fields removed (``ForwardedFields``), within the company's share
/// of the provider connections. A call the provider never answered (unreachable, 502; timed out
/// before it was wholly sent, 504; no connection free within `upstream.timeout`, 503) is given
/// back before the caller hears; one wholly sent and not answered within `upstream.timeout` (504)
/// stays charged at its hold, since the provider may have run it.
struct Forwarder: Sendable {
    let upstream: UpstreamClient
    /// `proxy.companyShare` of the provider's connections (calls forwarded at once), per company.
    let share: CompanyShare

    /// The provider's answer head and body, and the company's connection slot (released once the
    /// body is passed on).
    struct Answer: Sendable {
        let response: UpstreamResponse
        let ticket: ShareTicket
        var status: Int { Int(response.head.status.code) }
    }

    func forward(_ call: Call, _ admitted: AdmittedCall, logger: Logger, record: RequestRecord) async throws -> Answer {
        // Past its share the call waits its turn (within upstream.timeout) while other companies' go on.
        guard await share.acquire(for: admitted.user.companyID, timeout: upstream.waitLimit) else {
            await admitted.charge?.refund(status: nil, reason: .share, logger: logger)
            throw GatewayError.overloaded(
                "Your company has as many calls in flight to the AI provider as its share of this gateway allows; you were not charged. Try again shortly."
            )
        }
        let ticket = ShareTicket(share: share, company: admitted.user.companyID)
        let started = ContinuousClock.now
        do {
            let response = try await upstream.execute(
                method: HTTPMethod(rawValue: call.method.rawValue), target: call.target, headers: outboundHeaders(call),
                body: call.sendsBody ? call.body : nil)
            let status = Int(response.head.status.code)
            GatewayMetrics.upstream(ContinuousClock.now - started, status: status)
            record.update {
                $0.upstreamStatus = status
                $0.upstreamMillis = (ContinuousClock.now - started).milliseconds
            }
            return Answer(response: response, ticket: ticket)
        } catch UpstreamError.unanswered {
            // The whole request reached the provider, which may have run it and may bill it: the
            // call stays charged, its cost settled at its hold (SPEC §11, §14); only an answer
            // saying it failed gives a charge back.
            ticket.release()
            admitted.charge?.settle(status: 504, usage: UsageCapture(contentType: nil))
            GatewayMetrics.upstream(ContinuousClock.now - started, status: 504)
            record.update {
                $0.upstreamMillis = (ContinuousClock.now - started).milliseconds
                $0.upstreamStatus = 504
            }
            logger.warning("upstream failed", metadata: ["error": "\(UpstreamError.unanswered)"])
            throw GatewayError.upstreamTimeout(
                "The AI provider did not answer in time after receiving the whole request. It may still have run it, so the call stays counted; try again."
            )
        } catch {
            ticket.release()
            let timedOut = (error as? UpstreamError)?.isTimeout ?? false
            if let charge = admitted.charge, await charge.refund(status: nil, reason: timedOut ? .timeout : .unreachable, logger: logger) {
                record.update { $0.decision = "refunded" }
            }
            record.update { $0.upstreamMillis = (ContinuousClock.now - started).milliseconds }
            logger.warning("upstream failed", metadata: ["error": "\(String(describing: error))"])
            if timedOut {
                throw GatewayError.upstreamTimeout("The AI provider did not answer in time. You were not charged; try again.")
            }
            throw GatewayError.upstream("The AI provider could not be reached or broke the connection. You were not charged; try again.")
        }
    }

    /// The client's fields that go on, identity encoding asked for, and the provider's key.
    func outboundHeaders(_ call: Call) -> HTTPHeaders {
        var headers = HTTPHeaders()
        headers.reserveCapacity(call.headers.count + 2)
        let options = ForwardedFields.connectionOptions(call.headers[values: .connection])
        for field in call.headers where ForwardedFields.forwardsRequestHeader(field.name.canonicalName, connectionOptions: options) {
            headers.add(name: field.name.rawName, value: field.value)
        }
        headers.add(name: "accept-encoding", value: "identity")
        if let key = upstream.apiKey { headers.add(name: "x-api-key", value: key) }
        return headers
    }
}
