import Foundation
import Hummingbird
import Logging
import Synchronization

/// What answers the calls under the proxy prefix: the ``ProxyHandler`` (tests of the routing
/// around it give their own).
protocol MeteredCalls: Sendable {
    func handle(_ request: Request, context: GatewayContext) async throws -> Response
    /// A 401 unless the request carries a valid credential (any identity).
    func requireCredential(_ request: Request) async throws
}

extension ProxyHandler: MeteredCalls {}

/// The outermost middleware: gives every request an id (`request-id` header, logs, ledger),
/// sends calls under the proxy prefix to the ``ProxyHandler``, turns every error into the SPEC's
/// envelope, and writes one structured log line and the request metrics per request.
struct GatewayMiddleware<Proxy: MeteredCalls>: RouterMiddleware {
    typealias Context = GatewayContext

    let proxy: Proxy
    let prefix: String
    /// Paths under the prefix that CapGate answers itself.
    let ownPaths: Set<String>
    /// The methods of the router's routes: a known path asked with another method is 405.
    let methods: RouteMethods

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        var context = context
        let requestID = GatewayEdge.newRequestID()
        context.logger[metadataKey: "request_id"] = .string(requestID)
        context.record.update { $0.requestID = requestID }
        GatewayMetrics.inflight(1)
        defer { GatewayMetrics.inflight(-1) }

        var path = request.uri.path
        var proxied = false
        var response: Response
        do {
            response = try await dispatch(request, context: context, path: &path, proxied: &proxied, next: next)
        } catch let error as HTTPError where error.status == .notFound && !proxied {
            response = methodNotAllowed(request, path: path) ?? GatewayEdge.errorResponse(error, logger: context.logger)
        } catch {
            response = GatewayEdge.errorResponse(error, logger: context.logger)
        }
        response.headers[.requestID] = requestID
        report(request, response: response, path: path, proxied: proxied, context: context, started: started)
        return response
    }

    /// Sends the call to the proxy or to the router. Dot segments are resolved before anything is
    /// decided: the prefix and own-route checks and the upstream request all see the resolved
    /// path (a path that leaves the prefix that way is 400).
    func dispatch(
        _ request: Request, context: Context, path: inout String, proxied: inout Bool,
        next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let target: ForwardTarget
        do {
            target = try ForwardTarget(path: path, query: request.uri.query, prefix: prefix)
        } catch {
            // A call under the prefix is a credentialed one: its 401 first. (CapGate's public
            // routes, `/healthz` and the like, take no credential: outside the prefix their path's
            // 400 stands; with `proxy.prefix` `/` everything is under it.)
            guard path.hasPrefix(prefix) else { throw error }
            try await refuseUncredentialed(request, then: error)
        }
        path = target.path
        let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
        // CapGate's own routes are never forwarded, whatever the prefix (even `/`).
        proxied = target.isUnder(prefix) && !ownPaths.contains(trimmed) && trimmed != "/admin" && !trimmed.hasPrefix("/admin/")
        guard proxied else {
            // TRACE and CONNECT are never answered, on any path (SPEC §2); under the prefix the
            // proxy refuses them once the caller is authenticated.
            if request.method == .trace || request.method == .connect {
                let allowed = methods.allowed(for: path)
                var error = CallReader.methodRefusal(request.method)
                if !allowed.isEmpty { error.headers[.allow] = allowed.joined(separator: ", ") }
                throw error
            }
            // The router matched (or missed) the path as sent, before this middleware ran.
            if target.changed {
                throw GatewayError.invalidRequest(
                    "CapGate's own routes take paths without dot segments ('.', '..'); send \(path) instead.")
            }
            return try await next(request, context)
        }
        do {
            try target.checkForwardable()
        } catch {
            try await refuseUncredentialed(request, then: error)
        }
        // A fragment never belongs in a request target (RFC 9112); the parser drops it from the
        // path above, so it is refused here on the target as sent.
        if request.head.path?.contains("#") == true {
            try await refuseUncredentialed(
                request,
                then: GatewayError.invalidRequest("The request target holds a '#', which is not forwarded; percent-encode it as %23."))
        }
        // What goes upstream (and into the ledger and the idempotency fingerprint) is the resolved
        // path with the original query, in origin form.
        guard request.head.path != target.target else { return try await proxy.handle(request, context: context) }
        var head = request.head
        head.path = target.target
        return try await proxy.handle(Request(head: head, body: request.body), context: context)
    }

    /// Throws a path's 400 (`error`), after the 401 of a request without a valid credential: SPEC
    /// §2 orders 401 before 400, and a stranger learns nothing of how CapGate reads paths.
    func refuseUncredentialed(_ request: Request, then error: any Error) async throws -> Never {
        try await proxy.requireCredential(request)
        throw error
    }

    /// The 405 of a known path asked with another method (with `Allow`); nil for an unknown path.
    func methodNotAllowed(_ request: Request, path: String) -> Response? {
        let allowed = methods.allowed(for: path)
        guard !allowed.isEmpty else { return nil }
        let list = allowed.joined(separator: ", ")
        return GatewayError(
            .methodNotAllowed, "invalid_request_error", "This path answers \(list) only, not \(request.method.rawValue).",
            headers: [.allow: list]
        ).makeResponse()
    }

    /// The request's metrics and its one log line.
    func report(_ request: Request, response: Response, path: String, proxied: Bool, context: Context, started: ContinuousClock.Instant) {
        let values = context.record.snapshot
        let decision = values.decision ?? (response.status.code < 400 ? "none" : "rejected")
        let route = values.routeLabel ?? GatewayEdge.routeLabel(path: path, proxied: proxied, endpoint: context.endpointPath)
        GatewayMetrics.request(route: route, status: Int(response.status.code), decision: decision)
        guard context.logger.logLevel <= .info else { return }
        var metadata: Logger.Metadata = [
            "method": .string(request.method.rawValue),
            "route": .string(route),
            "path": .string(String(path.prefix(200))),
            "status": .stringConvertible(response.status.code),
            "decision": .string(decision),
            "latency_ms": .string(GatewayEdge.millis(ContinuousClock.now - started)),
        ]
        if let company = values.companyID { metadata["company_id"] = .string(company.uuidString.lowercased()) }
        if let user = values.userID { metadata["user_id"] = .string(user.uuidString.lowercased()) }
        if let status = values.upstreamStatus { metadata["upstream_status"] = .stringConvertible(status) }
        if let ms = values.admissionMillis { metadata["admission_ms"] = .string(GatewayEdge.millis(ms)) }
        if let ms = values.upstreamMillis { metadata["upstream_ms"] = .string(GatewayEdge.millis(ms)) }
        context.logger.info("request", metadata: metadata)
    }
}
