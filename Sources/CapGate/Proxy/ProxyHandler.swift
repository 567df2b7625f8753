import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1

/// Forwards a client call to the provider after admitting it, and settles the charge after.
///
/// 1. authenticate (company and user only from the verified credential) before a byte of the
///    body is read: an API key is looked up (``KnownKeys``), a JWT verified;
/// 2. read the body up to `proxy.maxBodyBytes` (413 above, before anything is charged);
/// 3. admit in one PostgreSQL transaction (402 over a cap, 503 when the database is away); a
///    call with an `Idempotency-Key` claims the key in the same transaction: a retry gets the
///    kept answer (nothing forwarded or charged), 409 while the first attempt is in flight, 422
///    for another request under the same key;
/// 4. forward with the provider key, client credentials and hop-by-hop headers removed;
/// 5. 2xx: the charge stands and the body streams back while token counts are captured and
///    then written to the ledger row, from inside the body writer (it runs after the handler
///    returns); non-2xx, unreachable (502) or timeout (504): refunded in one transaction.
public struct ProxyHandler: Sendable {
    let authenticator: Authenticator
    let metering: MeteringStore
    let upstream: UpstreamClient
    let knownKeys: KnownKeys
    /// What calls cost and which feature they use (SPEC §8).
    let routes: RouteTable
    let maxBodyBytes: Int
    /// `proxy.bodyBudgetBytes`: bounds the bytes of all request bodies being read at once.
    let bodyBudget: BodyBudget
    /// `proxy.idempotencyMaxBytes`: the largest answer kept for `Idempotency-Key` retries.
    let idempotencyMaxBytes: Int
    /// `proxy.maxJSONDepth`: the deepest nesting of a body CapGate reads.
    let maxJSONDepth: Int
    /// `proxy.companyShare` of the body budget (bytes being read) and of the provider's
    /// connections (calls forwarded at once), per company.
    let bodyShare: CompanyShare
    let upstreamShare: CompanyShare

    public init(
        authenticator: Authenticator, metering: MeteringStore, upstream: UpstreamClient, knownKeys: KnownKeys, routes: RouteTable,
        maxBodyBytes: Int, bodyBudget: BodyBudget, idempotencyMaxBytes: Int, maxJSONDepth: Int = 128, companySharePercent: Int = 25
    ) {
        self.maxJSONDepth = maxJSONDepth
        self.bodyShare = CompanyShare(total: bodyBudget.limit, percent: companySharePercent)
        self.upstreamShare = CompanyShare(total: upstream.limiter.maxConnections, percent: companySharePercent)
        self.routes = routes
        self.bodyBudget = bodyBudget
        self.authenticator = authenticator
        self.metering = metering
        self.upstream = upstream
        self.knownKeys = knownKeys
        self.maxBodyBytes = maxBodyBytes
        self.idempotencyMaxBytes = idempotencyMaxBytes
    }

    /// Headers never forwarded upstream: hop-by-hop fields, the client's credentials, and the
    /// ones the client must not steer.
    static let droppedRequestHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authorization",
        "proxy-authenticate", "proxy-connection", "host", "content-length", "x-api-key", "authorization",
        "accept-encoding", "expect", "x-capgate-company", "x-company-id", "cookie", "capgate-feature",
        // Method overrides: the provider must run the method CapGate matched and charged.
        "x-http-method-override", "x-http-method", "x-method-override",
    ]
    /// Headers of the provider's answer not passed back (also those its `Connection` header
    /// names, and every `anthropic-organization-*`: see ``forwardsResponseHeader(_:connectionOptions:)``).
    static let droppedResponseHeaders: Set<String> = [
        "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authenticate",
        "proxy-connection", "content-length", "request-id", "ratelimit", "ratelimit-policy", "anthropic-organization-id",
    ]

    public func handle(_ request: Request, context: GatewayContext) async throws -> Response {
        let logger = context.logger
        let record = context.record
        // The credential first: nothing of the body is read for a caller who is not one.
        let apiKey = authenticator.apiKey(in: request.headers)
        var verified: UserIdentity?
        let company: UUID
        if let apiKey {
            company = try await knownKeys.check(apiKey)
        } else {
            guard case .user(let identity) = try await authenticator.authenticate(request.headers) else {
                throw GatewayError.permission("The operator token cannot make metered calls; use a user's CapGate API key.")
            }
            verified = identity
            company = identity.companyID
        }
        // 405 and 415 from the head, then 413 while reading, then 400 for what was read.
        try Self.checkHead(request)
        let body = try await readBody(request, company: company)
        let idempotencyKey = try IdempotencyKey.key(in: request.headers)
        let callBody = try CallBody.read(body, contentType: request.headers[.contentType], maxDepth: maxJSONDepth)
        let path = request.uri.path
        let model = callBody.model
        var admissionRequest = AdmissionRequest(
            companyID: .zero, userID: .zero, units: 1, method: request.method.rawValue, route: Self.ledgerText(path, limit: 500),
            model: model, requestID: record.snapshot.requestID, idempotencyKey: nil, fingerprint: nil
        )
        let fingerprint = idempotencyKey.map { _ in
            IdempotencyKey.fingerprint(method: request.method.rawValue, target: request.head.path ?? path, body: body)
        }

        let admissionStart = ContinuousClock.now
        var table = try await routes.snapshot()
        var admittedUser: UserIdentity
        var admitted: Admission
        var callCost: CallCost
        var attempts = 0
        repeat {
            // Matched against the table as this gateway knows it; an admission that finds the
            // table changed since (stale_routes) changed nothing, and the call is matched again.
            // The path as sent (not as decoded here): that is what the provider will read.
            do {
                callCost = try Self.cost(
                    method: request.method.rawValue, path: Self.rawPath(request.head.path) ?? path, headers: request.headers,
                    body: callBody,
                    table: table)
            } catch let refusal as GatewayError {
                // A refusal read off this gateway's copy of the table (a header feature the route
                // no longer restricts, a route allowed again) stands only if the copy is current
                // (or the database cannot say: a refusal charges nothing).
                guard let current = try? await routes.version(), current != table.version else { throw refusal }
                table = try await rematch(after: &attempts)
                continue
            }
            admissionRequest.units = callCost.units
            // A free call buys nothing a retry could buy twice: its key is ignored, nothing kept.
            admissionRequest.idempotencyKey = callCost.units > 0 ? idempotencyKey : nil
            admissionRequest.fingerprint = callCost.units > 0 ? fingerprint : nil
            admissionRequest.feature = callCost.feature
            admissionRequest.routesVersion = table.version
            if let verified {
                admittedUser = verified
                admissionRequest.companyID = verified.companyID
                admissionRequest.userID = verified.userID
                // A token bound to features (jwt.featureClaim) is refused another one here, uncharged.
                guard try await checkBinding(verified, cost: callCost, table: table) == .allowed else {
                    table = try await rematch(after: &attempts)
                    continue
                }
                admitted = try await metering.admit(admissionRequest)
            } else if let apiKey {
                // The key is checked again inside the admission transaction (a revocation since the
                // check above applies), in the same round trip.
                (admittedUser, admitted) = try await metering.admit(key: apiKey, admissionRequest)
            } else {
                preconditionFailure("a call is authenticated by an API key or a verified token")
            }
            guard admitted.decision == .staleRoutes else { break }
            table = try await rematch(after: &attempts)
        } while true
        let user = admittedUser
        let admission = admitted
        let cost = callCost
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
        case .charged:
            break
        case .companyCap, .userCap:
            let scope = admission.decision == .companyCap ? "company" : "user"
            var headers = admission.state.rateLimitHeaders()
            headers[.retryAfter] = Self.retryAfter(admission.state)
            throw GatewayError(
                .init(code: 402), "usage_cap_exceeded", Self.capMessage(scope: scope, state: admission.state),
                usage: admission.state.json(scope: scope), headers: headers
            )
        case .noActivePlan:
            var headers = HTTPFields()
            headers[.retryAfter] = Self.retryAfter(admission.state)
            throw GatewayError(
                .init(code: 402), "no_active_plan",
                "Your company has no active plan right now. Ask your administrator to choose a plan.",
                usage: admission.state.json(scope: "company"), headers: headers
            )
        case .unknownUser:
            throw GatewayError.authentication("This user is unknown or disabled in its company.")
        case .unknownFeature, .featureNotInPlan, .featureLimitExceeded:
            throw Self.featureRefusal(admission, cost: cost)
        case .featureNotBound:
            throw Self.notBound(feature: cost.feature ?? "", bound: nil, credential: user.credential)
        case .staleRoutes:
            preconditionFailure("stale_routes is matched again above")
        case .idempotencyReplay:
            guard let answer = admission.answer else { throw DatabaseError.other("a replay without its answer") }
            record.update { $0.decision = "replayed" }
            return IdempotencyKey.replay(answer)
        case .idempotencyInFlight, .idempotencyNotKept, .idempotencyMismatch:
            throw IdempotencyKey.refusal(admission.decision, maxKeptBytes: idempotencyMaxBytes)
                ?? DatabaseError.other("an idempotency decision without an answer")
        }
        let charge = admission.ledgerID
        let requestID = admissionRequest.requestID
        // With an Idempotency-Key the answer is kept for retries (up to proxy.idempotencyMaxBytes).
        let keeper = admissionRequest.idempotencyKey.map {
            AnswerKeeper(metering: self.metering, user: user, key: $0, requestID: requestID, logger: logger)
        }

        var outboundHeaders = HTTPHeaders()
        outboundHeaders.reserveCapacity(request.headers.count + 2)
        let requestOptions = Self.connectionOptions(request.headers[values: .connection])
        for field in request.headers where Self.forwardsRequestHeader(field.name.canonicalName, connectionOptions: requestOptions) {
            outboundHeaders.add(name: field.name.rawName, value: field.value)
        }
        outboundHeaders.add(name: "accept-encoding", value: "identity")
        if let key = upstream.apiKey { outboundHeaders.add(name: "x-api-key", value: key) }
        let sendsBody = body.readableBytes > 0 || request.method == .post || request.method == .put || request.method == .patch

        // The company's share of the provider's connections: past it the call waits its turn
        // (within upstream.timeout) while other companies' calls go on.
        guard await upstreamShare.acquire(for: user.companyID, timeout: upstream.waitLimit) else {
            if let charge { await refund(user: user, ledgerID: charge, requestID: requestID, status: nil, reason: "share", logger: logger) }
            throw GatewayError.overloaded(
                "Your company has as many calls in flight to the AI provider as its share of this gateway allows; you were not charged. Try again shortly."
            )
        }
        let ticket = ShareTicket(share: upstreamShare, company: user.companyID)
        let upstreamStart = ContinuousClock.now
        let response: UpstreamResponse
        do {
            response = try await upstream.execute(
                method: HTTPMethod(rawValue: request.method.rawValue), target: request.head.path ?? path, headers: outboundHeaders,
                body: sendsBody ? body : nil
            )
        } catch {
            ticket.release()
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
        let responseOptions = Self.connectionOptions(response.head.headers["connection"])
        for (name, value) in response.head.headers
        where Self.forwardsResponseHeader(name.lowercased(), connectionOptions: responseOptions) {
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
            let refundedState = refunded ? Self.refunded(admission.state, units: cost.units) : admission.state
            headers[.rateLimit] = nil
            headers[.rateLimitPolicy] = nil
            headers.append(contentsOf: refundedState.rateLimitHeaders())
            switch response.body {
            case .whole(let whole, let failure):
                ticket.release()
                return Response(
                    status: .init(code: status), headers: headers, body: Self.body(whole, failure: failure, length: contentLength))
            case .stream(let stream):
                return Response(
                    status: .init(code: status),
                    headers: headers,
                    body: ResponseBody(contentLength: contentLength) { writer in
                        defer { ticket.release() }
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
            ticket.release()
            var capture = UsageCapture(contentType: contentType)
            capture.read(whole: whole)
            // The charge stands once the provider answered 2xx.
            if let charge {
                metering.settle(
                    companyID: user.companyID, ledgerID: charge, upstreamStatus: status,
                    inputTokens: capture.inputTokens, outputTokens: capture.outputTokens
                )
            }
            await keeper?.keep(
                status: status, contentType: contentType,
                body: failure == nil && whole.readableBytes <= idempotencyMaxBytes ? whole : nil)
            return Response(status: .init(code: status), headers: headers, body: Self.body(whole, failure: failure, length: contentLength))
        }
        guard case .stream(let stream) = response.body else { preconditionFailure("a body is whole or a stream") }
        let maxKept = idempotencyMaxBytes
        return Response(
            status: .init(code: status),
            headers: headers,
            body: ResponseBody(contentLength: contentLength) { writer in
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
                // The charge stands once the provider answered 2xx, even if the client left. Queued
                // before the answer ends, so a ledger read after it finds the tokens.
                if let charge {
                    metering.settle(
                        companyID: user.companyID, ledgerID: charge, upstreamStatus: status,
                        inputTokens: capture.inputTokens, outputTokens: capture.outputTokens
                    )
                }
                // Kept before the answer's last byte goes out: a retry sent after it finds it.
                await keeper?.keep(status: status, contentType: contentType, body: upstreamBroke ? nil : recorder?.bytes)
                if let failure { throw failure }
                try await writer.finish(nil)
            }
        )
    }

    /// The route table again, for a call matched with an older one (at most 3 attempts, then 503).
    func rematch(after attempts: inout Int) async throws -> RouteTable.Snapshot {
        attempts += 1
        guard attempts < 3 else {
            throw GatewayError.overloaded("The gateway's route table is being changed right now; try again.")
        }
        return try await routes.reload()
    }
}
