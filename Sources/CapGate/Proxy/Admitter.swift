import Foundation
import NIOCore

/// Step 2 of a metered call: matches it against the route table (its units and feature, SPEC §8)
/// and admits it in one PostgreSQL transaction (``MeteringStore``): charged, refused with
/// nothing charged, or, for a retry under an `Idempotency-Key` that succeeded, replayed.
struct Admitter: Sendable {
    let metering: MeteringStore
    /// What calls cost and which feature they use (SPEC §8).
    let routes: RouteTable
    /// `proxy.idempotencyMaxBytes`: the largest answer kept for `Idempotency-Key` retries.
    let idempotencyMaxBytes: Int
    /// `costs.*`: how a call's cost is bounded.
    let costs: CostSettings
    /// Reads the caller's rate windows for a free call's RateLimit fields.
    let usage: UsageStore

    enum Outcome: Sendable {
        /// Charged: forward it.
        case admitted(AdmittedCall)
        /// Nothing charged; `state` is the usage the admission saw.
        case refused(Refusal, UsageState)
        /// The kept answer of an earlier attempt under the same `Idempotency-Key`.
        case replayed(StoredAnswer)
    }

    func admit(_ call: Call, record: RequestRecord) async throws -> Outcome {
        let started = ContinuousClock.now
        var table = try await routes.snapshot()
        var attempts = 0
        while true {
            // Matched against the table as this gateway knows it; an admission that finds the
            // table changed since (stale_routes) changed nothing, and the call is matched again.
            let cost: CallCost
            do {
                cost = try CallCost.of(call, table: table)
            } catch let refusal as GatewayError {
                // A refusal read off this gateway's copy of the table (a header feature the route no
                // longer restricts, a route allowed again) stands only if the copy is current (or the
                // database cannot say: a refusal charges nothing).
                guard let current = try? await routes.version(), current != table.version else { throw refusal }
                table = try await rematch(after: &attempts)
                continue
            }
            let request = try admissionRequest(call, cost: cost, routesVersion: table.version)
            let user: UserIdentity
            var admission: Admission
            switch call.credential {
            case .token(let identity):
                // A token bound to features (jwt.featureClaim) is refused another one here, uncharged.
                switch try await binding(identity, cost: cost, table: table) {
                case .allowed: break
                case .staleRoutes:
                    table = try await rematch(after: &attempts)
                    continue
                case .refused(let refusal): return .refused(refusal, .unknown)
                }
                user = identity
                admission = try await metering.admit(request.for(identity))
            case .apiKey(let key):
                // The key is checked again inside the admission transaction (a revocation since it
                // was read applies), in the same round trip.
                (user, admission) = try await metering.admit(key: key, request)
            }
            guard admission.decision != .staleRoutes else {
                table = try await rematch(after: &attempts)
                continue
            }
            if cost.units == 0, admission.decision == .charged, admission.state.rate == nil {
                admission.state.rate = await freeCallWindows(user: user, feature: cost.feature, at: request.at)
            }
            return outcome(of: admission, cost: cost, user: user, request: request, started: started, record: record)
        }
    }

    /// A free call (units 0) is counted in no rate window (SPEC §14), but its answer carries the
    /// policies that apply to its caller, as every other answer does: the plan's windows and its
    /// feature's, read apart (one read; free routes are few, such as a model list). A read that
    /// fails leaves them out: the call itself was admitted.
    func freeCallWindows(user: UserIdentity, feature: String?, at: Date) async -> RateState? {
        var rate = try? await usage.rateWindows(company: user.companyID, user: user.userID, at: at)
        if let feature,
            let windows = try? await usage.featureRateWindows(company: user.companyID, user: user.userID, feature: feature, at: at)
        {
            if rate == nil { rate = RateState(limits: .init(), minute: windows.minute, counts: .init()) }
            rate?.feature = windows.windows
        }
        return rate
    }

    /// The admission's decision as the call's outcome, reported to the request log and metrics.
    func outcome(
        of admission: Admission, cost: CallCost, user: UserIdentity, request: AdmissionRequest, started: ContinuousClock.Instant,
        record: RequestRecord
    ) -> Outcome {
        let elapsed = ContinuousClock.now - started
        GatewayMetrics.admission(elapsed, decision: admission.decision.rawValue)
        record.update {
            $0.companyID = user.companyID
            $0.userID = user.userID
            $0.decision = admission.decision.rawValue
            $0.admissionMillis = elapsed.milliseconds
        }
        if admission.decision == .idempotencyReplay, let answer = admission.answer {
            record.update { $0.decision = "replayed" }
            return .replayed(answer)
        }
        if let refusal = Self.refusal(
            admission.decision, cost: cost, credential: user.credential, maxKeptBytes: idempotencyMaxBytes,
            scope: admission.budgetScope, model: request.model, rate: admission.state.rate, unknownTool: request.bound.unknownTool)
        {
            return .refused(refusal, admission.state)
        }
        let windows = admission.state.rate?.end ?? .none
        let charge = admission.ledgerID.map {
            Charge(
                metering: metering, companyID: user.companyID, ledgerID: $0, requestID: request.requestID, windows: windows,
                lease: windows.slot ? metering.slotTaken(companyID: user.companyID, ledgerID: $0) : nil)
        }
        return .admitted(
            AdmittedCall(user: user, state: admission.state, units: cost.units, charge: charge, idempotencyKey: request.idempotencyKey))
    }

    /// The refusal an admission decided, nil for a charge (or a replay).
    static func refusal(
        _ decision: Admission.Decision, cost: CallCost, credential: UserIdentity.Credential, maxKeptBytes: Int,
        scope: Refusal.Scope? = nil, model: String? = nil, rate: RateState? = nil, unknownTool: String? = nil
    ) -> Refusal? {
        let feature = cost.feature ?? "this feature"
        switch decision {
        case .charged, .staleRoutes, .idempotencyReplay: return nil
        case .companyCap: return .cap(.company)
        case .userCap: return .cap(.user)
        case .noActivePlan: return .noActivePlan
        case .unknownUser: return .unknownUser
        case .unknownFeature where cost.featureFromHeader: return .unknownFeature(feature)
        // Named by the route itself but no longer active: the company's plan cannot include it.
        case .unknownFeature, .featureNotInPlan: return .featureNotInPlan(feature: feature)
        case .featureLimitExceeded: return .featureLimit(feature: feature)
        case .featureNotBound: return .notBound(feature: feature, bound: nil, credential: credential)
        case .idempotencyInFlight, .idempotencyNotKept, .idempotencyMismatch: return .idempotency(decision, maxKeptBytes: maxKeptBytes)
        case .budgetExceeded: return .budget(scope ?? .company)
        case .unpricedModel: return .unpricedModel(model)
        case .maxTokensRequired: return .maxTokensRequired
        case .unboundedCall: return .unboundedCall(unknownTool: unknownTool)
        case .rateLimited:
            let window = rate?.refused ?? .userRPM
            if let limit = rate?.holdOverRefusingLimit, let hold = rate?.tokens {
                return .holdOverRateLimit(window, limit: limit, hold: hold)
            }
            return .rate(window)
        }
    }

    func admissionRequest(_ call: Call, cost: CallCost, routesVersion: Int64) throws -> AdmissionRequest {
        // A free call buys nothing a retry could buy twice: its key is ignored, nothing kept.
        let keyed = cost.units > 0
        return AdmissionRequest(
            companyID: .zero, userID: .zero, units: cost.units, method: call.method.rawValue,
            route: Call.ledgerText(call.path, limit: 500), model: call.reading.model, feature: cost.feature, requestID: call.requestID,
            idempotencyKey: keyed ? call.idempotencyKey : nil, fingerprint: keyed ? call.fingerprint : nil, routesVersion: routesVersion,
            bound: keyed ? try bound(of: call) : .unbounded)
    }

    /// What bounds a metered call's cost (SPEC §11): read from a JSON body that names a model
    /// (the body parsed whole already, so its second reading cannot fail); anything else cannot
    /// be bounded, which only matters where a budget applies (400 there).
    func bound(of call: Call) throws -> CostBound {
        guard call.reading.json != nil, call.reading.model != nil else { return .unbounded }
        let large = CostBound.enablesLargeWindow(call.headers[values: .anthropicBeta])
        return CostBound(
            bodyBytes: call.body.readableBytes, shape: try call.reading.promptShape(), maxTokens: call.reading.maxTokens,
            overheadTokens: costs.promptOverheadTokens, imageTokens: costs.imageTokens, largeWindow: large,
            toolOverhead: costs.toolOverheadTokens)
    }

    /// The route table again, for a call matched with an older one (at most 3 attempts, then 503).
    func rematch(after attempts: inout Int) async throws -> RouteTable.Snapshot {
        attempts += 1
        guard attempts < 3 else {
            throw GatewayError.overloaded("The gateway's route table is being changed right now; try again.")
        }
        return try await routes.reload()
    }
}

/// A call its admission charged, on its way to the provider.
struct AdmittedCall: Sendable {
    let user: UserIdentity
    /// The usage after the charge (the RateLimit fields).
    let state: UsageState
    let units: Int
    /// The ledger row to settle or give back.
    let charge: Charge?
    /// The `Idempotency-Key` its answer is kept under (nil for a free call).
    let idempotencyKey: String?
}

extension AdmissionRequest {
    /// This request on behalf of a verified token's company and user.
    func `for`(_ identity: UserIdentity) -> AdmissionRequest {
        var request = self
        request.companyID = identity.companyID
        request.userID = identity.userID
        return request
    }
}
