import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1

/// Forwards a client call to the provider after admitting it, and settles the charge after.
///
/// 1. authenticate (company and user only from the verified credential);
/// 2. read the body up to `proxy.maxBodyBytes` (413 above, before anything is charged);
/// 3. admit in one PostgreSQL transaction (402 over a cap, 503 when the database is away);
/// 4. forward with the provider key, client credentials and hop-by-hop headers removed;
/// 5. 2xx: the charge stands and the body streams back while token counts are captured and
///    then written to the ledger row, from inside the body writer (it runs after the handler
///    returns); non-2xx, unreachable (502) or timeout (504): refunded in one transaction.
public struct ProxyHandler: Sendable {
    let authenticator: Authenticator
    let metering: MeteringStore
    let upstream: UpstreamClient
    let maxBodyBytes: Int

    public init(authenticator: Authenticator, metering: MeteringStore, upstream: UpstreamClient, maxBodyBytes: Int) {
        self.authenticator = authenticator
        self.metering = metering
        self.upstream = upstream
        self.maxBodyBytes = maxBodyBytes
    }

    /// Headers never forwarded upstream: hop-by-hop fields, the client's credentials, and the
    /// ones the client must not steer.
    static let droppedRequestHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authorization",
        "proxy-authenticate", "proxy-connection", "host", "content-length", "x-api-key", "authorization",
        "accept-encoding", "expect", "x-capgate-company", "x-company-id", "cookie",
    ]
    /// Headers of the provider's answer not passed back.
    static let droppedResponseHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authenticate",
        "proxy-connection", "content-length", "request-id", "ratelimit", "ratelimit-policy",
    ]

    public func handle(_ request: Request, context: GatewayContext) async throws -> Response {
        let logger = context.logger
        let record = context.record
        let body = try await readBody(request)
        let path = request.uri.path
        let model = Self.model(in: body, contentType: request.headers[.contentType])
        let idempotencyKey = request.headers[.idempotencyKey].flatMap { $0.isEmpty ? nil : Self.ledgerText($0, limit: 200) }
        var admissionRequest = AdmissionRequest(
            companyID: .zero, userID: .zero, units: 1, method: request.method.rawValue, route: Self.ledgerText(path, limit: 500),
            model: model, requestID: record.snapshot.requestID, idempotencyKey: idempotencyKey
        )

        let admissionStart = ContinuousClock.now
        let user: UserIdentity
        let admission: Admission
        if let key = authenticator.apiKey(in: request.headers) {
            // Key lookup and admission in one round trip.
            (user, admission) = try await metering.admit(key: key, admissionRequest)
        } else {
            let identity = try await authenticator.authenticate(request.headers)
            guard case .user(let verified) = identity else {
                throw GatewayError.permission("The operator token cannot make metered calls; use a user's CapGate API key.")
            }
            user = verified
            admissionRequest.companyID = verified.companyID
            admissionRequest.userID = verified.userID
            admission = try await metering.admit(admissionRequest)
        }
        record.update {
            $0.companyID = user.companyID
            $0.userID = user.userID
        }
        let admissionTime = ContinuousClock.now - admissionStart
        GatewayMetrics.admission(admissionTime, decision: admission.decision.rawValue)
        record.update {
            $0.decision = admission.decision.rawValue
            $0.admissionMillis = admissionTime.milliseconds
        }

        switch admission.decision {
        case .charged, .replayed:
            break
        case .companyCap:
            throw GatewayError(
                .init(code: 402), "usage_cap_exceeded",
                Self.capMessage(scope: "company", state: admission.state),
                usage: admission.state.json(scope: "company"), headers: admission.state.rateLimitHeaders()
            )
        case .userCap:
            throw GatewayError(
                .init(code: 402), "usage_cap_exceeded",
                Self.capMessage(scope: "user", state: admission.state),
                usage: admission.state.json(scope: "user"), headers: admission.state.rateLimitHeaders()
            )
        case .noActivePlan:
            throw GatewayError(
                .init(code: 402), "no_active_plan",
                "Your company has no active plan right now. Ask your administrator to choose a plan.",
                usage: admission.state.json(scope: "company")
            )
        case .unknownUser:
            throw GatewayError.authentication("This user is unknown or disabled in its company.")
        }
        // The charge this attempt answers for: its own, or the one it replays (a retry with the same
        // Idempotency-Key). A failure gives it back only once every attempt at it failed.
        let charge = admission.ledgerID
        let replay = admission.decision == .replayed
        let requestID = admissionRequest.requestID

        var outboundHeaders = HTTPHeaders()
        outboundHeaders.reserveCapacity(request.headers.count + 2)
        for field in request.headers where !Self.droppedRequestHeaders.contains(field.name.canonicalName) {
            outboundHeaders.add(name: field.name.rawName, value: field.value)
        }
        outboundHeaders.add(name: "accept-encoding", value: "identity")
        if let key = upstream.apiKey { outboundHeaders.add(name: "x-api-key", value: key) }
        let sendsBody = body.readableBytes > 0 || request.method == .post || request.method == .put || request.method == .patch

        let upstreamStart = ContinuousClock.now
        let response: UpstreamResponse
        do {
            response = try await upstream.execute(
                method: HTTPMethod(rawValue: request.method.rawValue), target: request.head.path ?? path, headers: outboundHeaders,
                body: sendsBody ? body : nil
            )
        } catch {
            let timedOut = (error as? UpstreamError)?.isTimeout ?? false
            if let charge,
                await refund(
                    user: user, ledgerID: charge, requestID: requestID, status: nil, reason: timedOut ? "timeout" : "unreachable",
                    logger: logger)
            {
                record.update { $0.decision = "refunded" }
            }
            record.update { $0.upstreamMillis = (ContinuousClock.now - upstreamStart).milliseconds }
            logger.warning("upstream failed", metadata: ["error": "\(String(describing: error))"])
            if timedOut {
                throw GatewayError.upstreamTimeout("The AI provider did not answer in time. You were not charged; try again.")
            }
            throw GatewayError.upstream("The AI provider could not be reached or broke the connection. You were not charged; try again.")
        }
        let status = Int(response.head.status.code)
        GatewayMetrics.upstream(ContinuousClock.now - upstreamStart, status: status)
        record.update {
            $0.upstreamStatus = status
            $0.upstreamMillis = (ContinuousClock.now - upstreamStart).milliseconds
        }

        var headers = HTTPFields()
        headers.reserveCapacity(response.head.headers.count + 3)
        for (name, value) in response.head.headers where !Self.droppedResponseHeaders.contains(name.lowercased()) {
            if let fieldName = HTTPField.Name(name) { headers.append(HTTPField(name: fieldName, value: value)) }
        }
        headers.append(contentsOf: admission.state.rateLimitHeaders())
        let contentLength = response.head.headers.first(name: "content-length").flatMap(Int.init)
        let contentType = response.head.headers.first(name: "content-type")

        guard (200..<300).contains(status) else {
            var refunded = false
            if let charge {
                refunded = await refund(
                    user: user, ledgerID: charge, requestID: requestID, status: status, reason: "upstream_status", logger: logger)
                if refunded { record.update { $0.decision = "refunded" } }
            }
            // The provider's own error passes through, so SDKs show it; the charge is gone (unless
            // another attempt at it with the same Idempotency-Key is in flight or succeeded).
            let refundedState = refunded ? Self.refunded(admission.state) : admission.state
            headers[.rateLimit] = nil
            headers[.rateLimitPolicy] = nil
            headers.append(contentsOf: refundedState.rateLimitHeaders())
            switch response.body {
            case .whole(let whole, let failure):
                return Response(
                    status: .init(code: status), headers: headers, body: Self.body(whole, failure: failure, length: contentLength))
            case .stream(let stream):
                return Response(
                    status: .init(code: status),
                    headers: headers,
                    body: ResponseBody(contentLength: contentLength) { writer in
                        for try await chunk in stream { try await writer.write(chunk) }
                        try await writer.finish(nil)
                    }
                )
            }
        }

        let metering = self.metering
        // A small answer of known length arrived whole and goes out with the head in one write;
        // anything else (streams, large or unknown length) streams through as it arrives.
        if case .whole(let whole, let failure) = response.body {
            var capture = UsageCapture(contentType: contentType)
            capture.read(whole: whole)
            // The charge stands once the provider answered 2xx.
            if let charge {
                metering.settle(
                    companyID: user.companyID, ledgerID: charge, upstreamStatus: status,
                    inputTokens: capture.inputTokens, outputTokens: capture.outputTokens, replay: replay
                )
            }
            return Response(status: .init(code: status), headers: headers, body: Self.body(whole, failure: failure, length: contentLength))
        }
        guard case .stream(let stream) = response.body else { preconditionFailure("a body is whole or a stream") }
        return Response(
            status: .init(code: status),
            headers: headers,
            body: ResponseBody(contentLength: contentLength) { writer in
                var failure: (any Error)?
                var capture = UsageCapture(contentType: contentType)
                do {
                    for try await chunk in stream {
                        capture.feed(chunk)
                        try await writer.write(chunk)
                    }
                } catch {
                    failure = error
                }
                capture.finish()
                // The charge stands once the provider answered 2xx, even if the client left. Queued
                // before the answer ends, so a ledger read after it finds the tokens.
                if let charge {
                    metering.settle(
                        companyID: user.companyID, ledgerID: charge, upstreamStatus: status,
                        inputTokens: capture.inputTokens, outputTokens: capture.outputTokens, replay: replay
                    )
                }
                if let failure { throw failure }
                try await writer.finish(nil)
            }
        )
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

    func readBody(_ request: Request) async throws -> ByteBuffer {
        if let declared = request.headers[.contentLength].flatMap(Int.init), declared > maxBodyBytes {
            throw GatewayError.tooLarge(limit: maxBodyBytes)
        }
        do {
            return try await request.body.collect(upTo: maxBodyBytes)
        } catch let error as HTTPError where error.status == .contentTooLarge {
            throw GatewayError.tooLarge(limit: maxBodyBytes)
        } catch let error as NIOTooManyBytesError {
            _ = error
            throw GatewayError.tooLarge(limit: maxBodyBytes)
        }
    }

    /// Reports this attempt's failure before the caller is answered: the charge is given back
    /// unless another attempt at it (the same Idempotency-Key) is in flight or succeeded. Returns
    /// whether it was given back now. If the database is unavailable the caller is answered
    /// anyway (false: the outcome is not known yet) and the report is retried in the background
    /// (it is idempotent), so a call that failed upstream while PostgreSQL was down does not stay
    /// charged.
    @discardableResult
    func refund(user: UserIdentity, ledgerID: Int64, requestID: String, status: Int?, reason: String, logger: Logger) async -> Bool {
        let metering = self.metering
        let refund = { @Sendable in
            try await metering.refund(companyID: user.companyID, ledgerID: ledgerID, requestID: requestID, upstreamStatus: status)
        }
        let failed = { @Sendable in
            // The ledger row stays charged; `capgate verify` and the operator see it.
            logger.error("refund failed", metadata: ["ledger_id": "\(ledgerID)", "reason": "\(reason)"])
        }
        do {
            guard try await refund() else { return false }
            GatewayMetrics.refund(reason: reason)
            return true
        } catch DatabaseError.unavailable {
            logger.warning("refund delayed: the database is unavailable; retrying", metadata: ["ledger_id": "\(ledgerID)"])
            Task {
                do {
                    if try await metering.database.untilAvailable(refund) { GatewayMetrics.refund(reason: reason) }
                } catch {
                    failed()
                }
            }
            return false
        } catch {
            failed()
            return false
        }
    }

    static func refunded(_ state: UsageState) -> UsageState {
        var s = state
        s.companyUsed = max(0, s.companyUsed - 1)
        s.userUsed = s.userUsed.map { max(0, $0 - 1) }
        return s
    }

    /// The `model` field of a JSON body, for the ledger (nothing else of the body is read).
    static func model(in body: ByteBuffer, contentType: String?) -> String? {
        guard body.readableBytes > 0, contentType?.lowercased().contains("json") ?? true else { return nil }
        guard let model = JSON.topLevelString("model", in: body) else { return nil }
        return ledgerText(model, limit: 200)
    }

    /// Client-supplied text as the ledger stores it: at most `limit` characters, without NUL
    /// (which PostgreSQL text cannot hold).
    static func ledgerText(_ text: some StringProtocol, limit: Int) -> String {
        let clipped = text.prefix(limit)
        return clipped.contains("\u{0}") ? String(clipped.filter { $0 != "\u{0}" }) : String(clipped)
    }

    static func capMessage(scope: String, state: UsageState) -> String {
        let planName = state.plan?.name ?? "current"
        let end = state.periodEnd.map { " The allowance renews on \(Timestamp.format($0))." } ?? ""
        let upgrade = state.upgrade.map { " Upgrading to the \($0.plan) plan raises the limit." } ?? ""
        if scope == "company" {
            let limit = state.companyLimit.map(String.init) ?? "unlimited"
            return "Your company has used all \(limit) analyses included in the \(planName) plan for this period.\(end)\(upgrade)"
        }
        let limit = state.userLimit.map(String.init) ?? "unlimited"
        return "You have used all \(limit) analyses allowed per user in this period.\(end)\(upgrade)"
    }
}
