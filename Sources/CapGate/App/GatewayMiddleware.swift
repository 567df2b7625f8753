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

        let path = request.uri.path
        let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
        // CapGate's own routes are never forwarded, whatever the prefix (even `/`).
        let proxied = path.hasPrefix(prefix) && !ownPaths.contains(trimmed) && !trimmed.hasPrefix("/admin/")
        var response: Response
        do {
            if proxied {
                response = try await proxy.handle(request, context: context)
            } else {
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
        let route = proxied ? Self.routeLabel(path) : (values.routeLabel ?? Self.routeLabel(path))
        GatewayMetrics.request(route: route, status: Int(response.status.code), decision: decision)
        if context.logger.logLevel <= .info {
            var metadata: Logger.Metadata = [
                "method": .string(request.method.rawValue),
                "route": .string(route),
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

    /// A bounded-cardinality label for a path: segments that look like ids become `:id`.
    static func routeLabel(_ path: String) -> String {
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).prefix(8).map { segment -> Substring in
            if segment.count >= 8 && segment.contains(where: \.isNumber) { return ":id" }
            return segment.count > 40 ? ":long" : segment
        }
        return segments.joined(separator: "/")
    }
}
