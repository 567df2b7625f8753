import Foundation
import Hummingbird
import Logging
import Synchronization

/// The HTTP edge's own parts, used by ``GatewayMiddleware``: request ids, the error envelope
/// for any error, and the `route` label of logs and metrics.
enum GatewayEdge {
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
