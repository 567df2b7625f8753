import Foundation

/// Who picks the feature (SPEC §8): a bound credential is charged only to its features. An API
/// key's binding (`api_keys.features`) is checked inside the admission transaction, so a change
/// applies to the next call (`feature_not_bound`); a token's (`jwt.featureClaim`) cannot change
/// and is checked here, before anything is charged.
extension Admitter {
    /// What a token's binding says about a call matched with `table`.
    enum Binding: Equatable {
        /// Unbound, no feature, or one of the token's features: admit it.
        case allowed
        /// The route table changed since `table`: match the call again.
        case staleRoutes
        /// The token may not be charged to the call's feature (or, checked first as for a key, its
        /// `CapGate-Feature` names an unknown or inactive feature).
        case refused(Refusal)
    }

    func binding(_ identity: UserIdentity, cost: CallCost, table: RouteTable.Snapshot) async throws -> Binding {
        guard let bound = identity.features, let feature = cost.feature, !bound.contains(feature) else { return .allowed }
        let (version, active) = try await routes.featureState(feature)
        guard version == table.version else { return .staleRoutes }
        if cost.featureFromHeader, !active { return .refused(.unknownFeature(feature)) }
        return .refused(.notBound(feature: feature, bound: bound, credential: identity.credential))
    }
}
