import Foundation
import Hummingbird
import Logging
import Synchronization

/// The outermost middleware: gives every request an id (`request-id` header, logs, ledger),
/// sends calls under the proxy prefix to the ``ProxyHandler``, turns every error into the SPEC's
/// envelope, and writes one structured log line and the request metrics per request.
struct GatewayMiddleware: RouterMiddleware {
    typealias Context = GatewayContext

    let proxy: ProxyHandler
    let prefix: String
    /// Paths under the prefix that CapGate answers itself.
    let ownPaths: Set<String>
    /// The methods of the router's routes: a known path asked with another method is 405.
    let methods: RouteMethods

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        var context = context
        let requestID = Self.newRequestID()
        context.logger[metadataKey: "request_id"] = .string(requestID)
        context.record.update { $0.requestID = requestID }
        GatewayMetrics.inflight(1)
        defer { GatewayMetrics.inflight(-1) }

        var request = request
        var path = request.uri.path
        var proxied = false
        var response: Response
        do {
            // Dot segments are resolved before anything is decided: the prefix and own-route
            // checks and the upstream request all see the resolved path (a path that leaves the
            // prefix that way is 400).
            let target = try ForwardTarget(path: path, query: request.uri.query, prefix: prefix)
            path = target.path
            let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
            // CapGate's own routes are never forwarded, whatever the prefix (even `/`).
            proxied = target.isUnder(prefix) && !ownPaths.contains(trimmed) && trimmed != "/admin" && !trimmed.hasPrefix("/admin/")
            if proxied {
                try target.checkForwardable()
                // A fragment never belongs in a request target (RFC 9112); the parser drops it from
                // the path above, so it is refused here on the target as sent.
                if request.head.path?.contains("#") == true {
                    throw GatewayError.invalidRequest("The request target holds a '#', which is not forwarded; percent-encode it as %23.")
                }
                // What goes upstream (and into the ledger and the idempotency fingerprint) is the
                // resolved path with the original query, in origin form.
                if request.head.path != target.target {
                    var head = request.head
                    head.path = target.target
                    request = Request(head: head, body: request.body)
                }
                response = try await proxy.handle(request, context: context)
            } else {
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
                response = try await next(request, context)
            }
        } catch let error as HTTPError where error.status == .notFound && !proxied {
            let allowed = methods.allowed(for: path)
            if allowed.isEmpty {
                response = Self.errorResponse(error, logger: context.logger)
            } else {
                let list = allowed.joined(separator: ", ")
                var headers = HTTPFields()
                headers[.allow] = list
                response = GatewayError(
                    .methodNotAllowed, "invalid_request_error", "This path answers \(list) only, not \(request.method.rawValue).",
                    headers: headers
                ).makeResponse()
            }
        } catch {
            response = Self.errorResponse(error, logger: context.logger)
        }
        response.headers[.requestID] = requestID

        let values = context.record.snapshot
        let decision = values.decision ?? (response.status.code < 400 ? "none" : "rejected")
        let route = values.routeLabel ?? Self.routeLabel(path: path, proxied: proxied, endpoint: context.endpointPath)
        GatewayMetrics.request(route: route, status: Int(response.status.code), decision: decision)
        if context.logger.logLevel <= .info {
            var metadata: Logger.Metadata = [
                "method": .string(request.method.rawValue),
                "route": .string(route),
                "path": .string(String(path.prefix(200))),
                "status": .stringConvertible(response.status.code),
                "decision": .string(decision),
                "latency_ms": .string(Self.millis(ContinuousClock.now - started)),
            ]
            if let company = values.companyID { metadata["company_id"] = .string(company.uuidString.lowercased()) }
            if let user = values.userID { metadata["user_id"] = .string(user.uuidString.lowercased()) }
            if let status = values.upstreamStatus { metadata["upstream_status"] = .stringConvertible(status) }
            if let ms = values.admissionMillis { metadata["admission_ms"] = .string(Self.millis(ms)) }
            if let ms = values.upstreamMillis { metadata["upstream_ms"] = .string(Self.millis(ms)) }
            context.logger.info("request", metadata: metadata)
        }
        return response
    }

    /// `req_` and 24 hex digits: a random tag drawn once per process, then a 64-bit counter
    /// scrambled by a bijective mix (unique within the process, unguessable-looking, and no
    /// system call per request).
    static func newRequestID() -> String {
        let n = requestCounter.wrappingAdd(1, ordering: .relaxed).oldValue
        return "req_" + hex(requestIDTag, digits: 8) + hex(mix(n &+ requestIDSeed), digits: 16)
    }

    private static let requestIDTag = UInt64(UInt32.random(in: .min ... .max))
    private static let requestIDSeed = UInt64.random(in: .min ... .max)
    private static let requestCounter = Atomic<UInt64>(0)

    /// SplitMix64's finaliser: a bijection on 64-bit values.
    static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }

    static func hex(_ value: UInt64, digits: Int) -> String {
        let text = String(value, radix: 16)
        return text.count >= digits ? text : String(repeating: "0", count: digits - text.count) + text
    }

    /// Milliseconds with two decimals.
    static func millis(_ duration: Duration) -> String { millis(duration.milliseconds) }

    static func millis(_ ms: Double) -> String {
        let hundredths = Int((ms * 100).rounded())
        let fraction = hundredths % 100
        return "\(hundredths / 100).\(fraction < 10 ? "0" : "")\(fraction)"
    }

    /// Any error as the SPEC's envelope; never a bare 500 for something the caller can fix.
    static func errorResponse(_ error: any Error, logger: Logger) -> Response {
        switch error {
        case let error as GatewayError:
            return error.makeResponse()
        case let error as DatabaseError:
            switch error {
            case .unavailable:
                return GatewayError.overloaded().makeResponse()
            case .constraint:
                return GatewayError.conflict("The change conflicts with existing data.").makeResponse()
            case .other:
                return GatewayError(.internalServerError, "api_error", "An internal error occurred; it was logged.").makeResponse()
            }
        case let error as HTTPError:
            switch error.status {
            case .notFound:
                return GatewayError.notFound("No such route. CapGate's own routes are documented in openapi.yaml.").makeResponse()
            case .contentTooLarge:
                return GatewayError(.contentTooLarge, "request_too_large", "The request body is too large.").makeResponse()
            case .methodNotAllowed:
                return GatewayError(.methodNotAllowed, "invalid_request_error", "This method is not allowed on this route.").makeResponse()
            case .badRequest:
                return GatewayError.invalidRequest(error.body ?? "The request could not be read.").makeResponse()
            default:
                let type =
                    error.status.code == 401
                    ? "authentication_error" : error.status.code == 403 ? "permission_error" : "invalid_request_error"
                return GatewayError(error.status, type, error.body ?? error.status.reasonPhrase).makeResponse()
            }
        default:
            logger.error("unhandled error", metadata: ["error": "\(String(reflecting: error))"])
            return GatewayError(.internalServerError, "api_error", "An internal error occurred; it was logged.").makeResponse()
        }
    }

    /// The `route` label of metrics and logs, from CapGate's route table and never the raw
    /// path (SPEC §7): the matched route pattern of CapGate's own routes (such as
    /// `/admin/v1/companies/{id}/usage`), one of a fixed set of provider routes or `proxied` for a
    /// forwarded call, and `unmatched` for anything no route matched.
    static func routeLabel(path: String, proxied: Bool, endpoint: String?) -> String {
        if proxied { return ProviderRoutes.label(for: path) }
        guard let endpoint, endpoint != "NotFound", !endpoint.isEmpty else { return ProviderRoutes.unmatched }
        return endpoint.hasPrefix("/") ? endpoint : "/" + endpoint
    }
}
