import Hummingbird
import Logging

/// The gateway's own routes as `METHOD /path` (openapi.yaml documents exactly these).
func routerRoutes(configuration: CapGateConfiguration) async throws -> Set<String> {
    let parts = try await GatewayParts(configuration: configuration, logger: Logger(label: "inspection"))
    let routes = Set(
        parts.router.routes.map { route in
            let path = route.path.description
            return "\(route.method.rawValue) \(path.hasPrefix("/") ? path : "/" + path)"
        }
    )
    try await parts.upstream.shutdown()
    return routes
}
