import Foundation
import NIOCore

/// One call to be admitted against the company's and the user's caps.
public struct AdmissionRequest: Sendable {
    public var companyID: UUID
    public var userID: UUID
    public var units: Int
    public var method: String
    public var route: String
    public var model: String?
    public var feature: String?
    public var requestID: String
    public var idempotencyKey: String?
    /// SHA-256 of the request the `Idempotency-Key` is bound to (``IdempotencyKey/fingerprint``).
    public var fingerprint: ByteBuffer?
    public var at: Date
    /// The route table version the call's units and feature were matched with (``RouteTable``);
    /// nil: not checked. An older one than the database's is answered ``Admission/Decision/staleRoutes``.
    public var routesVersion: Int64?
    /// What bounds the call's cost (SPEC §11): its hold is priced from it and `model`.
    public var bound: CostBound

    public init(
        companyID: UUID, userID: UUID, units: Int = 1, method: String, route: String, model: String? = nil,
        feature: String? = nil, requestID: String, idempotencyKey: String? = nil, fingerprint: ByteBuffer? = nil,
        at: Date = Date(), routesVersion: Int64? = nil, bound: CostBound = .unbounded
    ) {
        self.routesVersion = routesVersion
        self.bound = bound
        self.companyID = companyID
        self.userID = userID
        self.units = units
        self.method = method
        self.route = route
        self.model = model
        self.feature = feature
        self.requestID = requestID
        self.idempotencyKey = idempotencyKey
        self.fingerprint = fingerprint
        self.at = at
    }
}

/// What the admission transaction decided.
public struct Admission: Sendable {
    public enum Decision: String, Sendable, CaseIterable {
        /// Charged now; `ledgerID` is the new ledger row.
        case charged
        case companyCap = "company_cap"
        case userCap = "user_cap"
        case noActivePlan = "no_active_plan"
        case unknownUser = "unknown_user"
        /// The call names a feature that does not exist or is not active.
        case unknownFeature = "unknown_feature"
        /// The API key is bound to features (`api_keys.features`) and the call's is not one of
        /// them (403, nothing charged; SPEC §8 "Who picks the feature").
        case featureNotBound = "feature_not_bound"
        /// The company's plan has no enabled entitlement for the call's feature (402).
        case featureNotInPlan = "feature_not_in_plan"
        /// A limit of the call's feature is reached (402).
        case featureLimitExceeded = "feature_limit_exceeded"
        /// The call was matched against an older route table: nothing changed; match it again.
        case staleRoutes = "stale_routes"
        /// The `Idempotency-Key`'s attempt succeeded before: its stored answer is returned.
        case idempotencyReplay = "idempotency_replay"
        /// The `Idempotency-Key`'s first attempt is still in flight (409).
        case idempotencyInFlight = "idempotency_in_flight"
        /// The `Idempotency-Key`'s attempt succeeded with an answer too large to keep (409).
        case idempotencyNotKept = "idempotency_not_kept"
        /// The `Idempotency-Key` was used for another request (422).
        case idempotencyMismatch = "idempotency_mismatch"
        /// The call's hold does not fit the company's or the user's cost budget (402; SPEC §11).
        case budgetExceeded = "budget_exceeded"
        /// A budget applies and the call's model has no price (400, nothing changed).
        case unpricedModel = "unpriced_model"
        /// A budget applies and the call has no `max_tokens` (400, nothing changed).
        case maxTokensRequired = "max_tokens_required"
        /// A budget applies and the body lets the provider add tokens the price book cannot bound
        /// (server tools, a message batch, a body that is not JSON) (400, nothing changed).
        case unboundedCall = "unbounded_call"
        /// A rate window or the user's calls in flight are full (429, nothing changed; SPEC §14).
        case rateLimited = "rate_limited"

        /// Charged: the call may be forwarded.
        public var admitted: Bool { self == .charged }
    }

    public var decision: Decision
    public var ledgerID: Int64?
    public var periodID: Int64?
    public var state: UsageState
    /// Whose budget refused a ``Decision/budgetExceeded``.
    public var budgetScope: Refusal.Scope? = nil
    /// The stored answer of an ``Decision/idempotencyReplay``.
    public var answer: StoredAnswer?
}

/// An answer kept for retries with the same `Idempotency-Key`: status, content type and body
/// (a stream's bytes as they were sent).
public struct StoredAnswer: Sendable {
    public var status: Int
    public var contentType: String?
    public var body: ByteBuffer
}

/// One call queued for batched admission: an API key's hash (the key is checked inside the
/// admission transaction), or nil when `request` carries a verified token's company and user.
public struct AdmissionItem: Sendable {
    public var keyHash: ByteBuffer?
    public var request: AdmissionRequest
}

/// What an admission function answered for one call (a `capgate_admitted` row), typed: read in
/// parts of a few columns each (Storage/AdmittedRow.swift).
public struct AdmissionRow: Sendable {
    /// The credential's check, and its company, user and role when it is ok.
    var caller: AdmittedCaller
    /// Nil unless `caller.auth` is ok.
    var decision: Admission.Decision?
    /// The ledger row of a charge.
    var ledgerID: Int64?
    /// The plan period and its unit counters.
    var period: AdmittedPeriod
    /// The call's feature and its windows (nil without a feature).
    var feature: FeatureState? = nil
    /// The stored answer, for `idempotency_replay`.
    var answer: StoredAnswer? = nil
    /// A refusal's upgrade offer (`capgate_upgrade_offer`), answered in the same row.
    var upgrade: UpgradeOffer? = nil
    /// The cost counters and the call's hold (nil before the counters were reached).
    var cost: CostState? = nil
    /// Whose budget refused a `budget_exceeded`.
    var budgetScope: Refusal.Scope? = nil
    /// The call's rate windows (SPEC §14), once it reached them (nil: none set, or refused before).
    var rate: RateState? = nil
}

/// The plan a refused company could move to (SPEC §3 `upgrade`), with the refused feature
/// window's limit there (SPEC §8 `feature_limit`, nil: unlimited or not a feature's refusal).
struct UpgradeOffer: Sendable {
    var upgrade: UsageState.Upgrade
    var featureLimit: Int64?
}

/// The provider's status and usage for a charge that stands, queued for writing: its cost is
/// settled from `usage` (or its hold, when the usage is not known).
struct Settlement: Sendable {
    var companyID: UUID
    var ledgerID: Int64
    var status: Int32
    var usage: ProviderUsage
    /// The call holds tokens in a token window (SPEC §14): the settlement trades that hold for
    /// the real count in the same transaction.
    var endsInWindows = false

    /// What the settlement writes in the call's token windows.
    enum WindowTokens: Sendable, Equatable {
        /// The call holds nothing in a token window.
        case notHeld
        /// The usage is not known: the hold stays.
        case unknown
        /// The real tokens: input, cache writes and reads, output.
        case count(Int64)
    }

    /// The settlement's count for this call's token windows.
    var windowTokens: WindowTokens {
        guard endsInWindows else { return .notHeld }
        guard usage.known else { return .unknown }
        let counts = [usage.inputTokens, usage.outputTokens, usage.cacheWrite5m, usage.cacheWrite1h, usage.cacheRead]
        return .count(counts.reduce(Int64(0)) { $0 + max(0, $1 ?? 0) })
    }
}

extension UUID {
    /// The nil UUID: a placeholder until the credential names the company and user, and the
    /// "absent" value in the batch function's arrays. (`UUID()` would read /dev/urandom.)
    static let zero = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
}
