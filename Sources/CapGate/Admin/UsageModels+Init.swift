import Foundation

// Initializers for the stores of other targets (`CapGateDev`'s in-memory ``UsageReading``), besides
// the memberwise ones this module uses: a read model is built by a store, never by a route.

extension CallerUsage {
    package init(
        company: UUID, user: UUID, appAccountToken: UUID?, state: UsageState, features: [FeatureUsage], cost: CostUsage, at: Date
    ) {
        self.company = company
        self.user = user
        self.appAccountToken = appAccountToken
        self.state = state
        self.features = features
        self.cost = cost
        self.at = at
    }
}

extension UsageStore.Event {
    /// A charged or refunded call of `user` as the ledger keeps it; the tokens, cost and
    /// settlement details are set on the value afterwards.
    package init(
        id: Int64, createdAt: Date, companyID: UUID, userID: UUID, period: (start: Date, end: Date), units: Int32, route: String,
        model: String?, feature: String?, outcome: String, requestID: String, settlement: UnsettledCharges.State
    ) {
        self.init(
            id: id, createdAt: createdAt, companyID: companyID, userID: userID, periodStart: period.start, periodEnd: period.end,
            units: units, inputTokens: nil, outputTokens: nil, method: "POST", route: route, model: model, feature: feature,
            outcome: outcome, upstreamStatus: nil, requestID: requestID, idempotencyKey: nil, settlement: settlement)
    }
}
