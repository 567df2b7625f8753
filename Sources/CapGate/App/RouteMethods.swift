import Hummingbird
import Synchronization

/// The methods each of the gateway's own route templates answers, so that a known path asked
/// with another method is answered 405 with an `Allow` header (Hummingbird's router answers any
/// miss with 404). Filled once the routes are registered; read only for requests the router
/// did not match.
final class RouteMethods: Sendable {
    private struct Template {
        /// Literal segments; nil where the template has a parameter.
        var segments: [Substring?]
        var methods: [String]
    }

    private let templates = Mutex<[Template]>([])

    /// Records the routes of `router` (its paths as `/a/{id}/b`).
    func record(_ router: Router<some RequestContext>) {
        var byPath: [String: [String]] = [:]
        for route in router.routes {
            byPath[route.path.description, default: []].append(route.method.rawValue)
        }
        let recorded = byPath.map { path, methods in
            Template(
                segments: path.split(separator: "/").map { $0.hasPrefix("{") ? nil : $0 },
                methods: methods.sorted())
        }
        templates.withLock { $0 = recorded }
    }

    /// The methods `path` answers to, empty when no route has that path.
    func allowed(for path: String) -> [String] {
        let segments = path.split(separator: "/")
        return templates.withLock { templates in
            var methods: [String] = []
            for template in templates where template.segments.count == segments.count {
                if zip(template.segments, segments).allSatisfy({ $0.0 == nil || $0.0 == $0.1 }) {
                    methods += template.methods
                }
            }
            return Array(Set(methods)).sorted()
        }
    }
}
