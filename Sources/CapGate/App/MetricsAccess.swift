import Foundation
import HTTPTypes

/// Who may read `/metrics` (SPEC §7): the operator token or `metrics.token` as a Bearer token,
/// or anyone when `metrics.public` is true. The exposition names routes, decisions and pool
/// state for every tenant together, so it is the operator's.
struct MetricsAccess: Sendable {
    var tokens: [String]
    var isPublic: Bool

    init(configuration: CapGateConfiguration) {
        tokens = configuration.operators.all.map(\.token) + [configuration.metrics.token].compactMap { $0 }
        isPublic = configuration.metrics.isPublic
    }

    /// Throws the 401 for a request that may not read the metrics.
    func check(_ headers: HTTPFields) throws {
        guard !isPublic else { return }
        guard let authorization = headers[.authorization], authorization.count > 7, authorization.prefix(7).lowercased() == "bearer "
        else {
            throw GatewayError.authentication("/metrics needs the operator token or metrics.token as 'Authorization: Bearer <token>'.")
        }
        let token = authorization.dropFirst(7).trimmingCharacters(in: .whitespaces)
        guard tokens.contains(where: { ApiKeyGenerator.constantTimeEquals(token, $0) }) else {
            throw GatewayError.authentication("This token may not read /metrics.")
        }
    }
}
