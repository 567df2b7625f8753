import Foundation
import Hummingbird

/// SPEC §8, the operator's half: features, plan entitlements and the route table.
struct FeatureRoutes {
    let features: FeatureStore

    func register(on group: RouterGroup<AuthenticatedContext>) {
    }
}
