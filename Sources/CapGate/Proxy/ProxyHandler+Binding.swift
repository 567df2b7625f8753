import Foundation

/// Who picks the feature (SPEC §8): a bound credential is charged only to its features. An API
/// key's binding (`api_keys.features`) is checked inside the admission transaction, so a change
/// applies to the next call (`feature_not_bound`); a token's (`jwt.featureClaim`) cannot change
/// and is checked here, before anything is charged.
extension ProxyHandler {
    /// What a token's binding says about a call matched with `table`.
    enum Binding: Equatable {
        /// Unbound, no feature, or one of the token's features: admit it.
        case allowed
        /// The route table changed since `table`: match the call again.
        case staleRoutes
    }

    /// Throws the 403 for a call a bound token may not be charged to (or the 400 of an unknown or
    /// inactive feature its `CapGate-Feature` names: that check comes first, as for a key).
    func checkBinding(_ identity: UserIdentity, cost: CallCost, table: RouteTable.Snapshot) async throws -> Binding {
        guard let bound = identity.features, let feature = cost.feature, !bound.contains(feature) else { return .allowed }
        let (version, active) = try await routes.featureState(feature)
        guard version == table.version else { return .staleRoutes }
        if cost.featureFromHeader, !active {
            throw GatewayError.invalidRequest(
                "CapGate-Feature names \"\(feature)\", which is not a feature of this gateway or is not active.")
        }
        throw Self.notBound(feature: feature, bound: bound, credential: identity.credential)
    }

    /// The 403 of a bound credential used for another feature; nothing was charged.
    static func notBound(feature: String, bound: [String]?, credential: UserIdentity.Credential) -> GatewayError {
        let what = credential == .jwt ? "This token" : "This API key"
        let list = bound.map { $0.isEmpty ? " (none)" : ": " + $0.joined(separator: ", ") } ?? ""
        return GatewayError.permission(
            "\(what) may be charged only to the features it is bound to\(list); this call uses \"\(feature)\". "
                + "Nothing was charged. Use a credential for \(feature), or a route of your own feature.")
    }
}
