import Foundation
import NIOCore
import PostgresNIO

// A `capgate_admitted` row read in parts of a few columns each, every column by its name
// (``AdmittedColumn``) in one place, NULL read as nil and the functions' kinds as enums
// (SQLValues.swift). A part that is absent from the row (no feature, no stored answer, no rate
// window reached) is nil, its other columns not read.

extension AdmissionRow {
    /// A `capgate_admitted` row of ``AdmittedColumn/selectList``.
    init(admitted row: PostgresRow) throws {
        try self.init(admitted: AdmittedCells(row))
    }

    init(admitted row: AdmittedCells) throws {
        caller = try AdmittedCaller(row)
        decision = Admission.Decision(sql: try row.decode(.decision))
        ledgerID = try row.decode(.ledgerID)
        budgetScope = Refusal.Scope(sql: try row.decode(.budgetScope))
        period = try AdmittedPeriod(row)
        feature = try FeatureState(admitted: row)
        answer = try StoredAnswer(admitted: row)
        upgrade = try UpgradeOffer(admitted: row)
        cost = try CostState(admitted: row)
        rate = try RateState(admitted: row, feature: feature?.id)
    }
}

/// The credential's check (`auth`), and the company, user and role it names when it is ok.
struct AdmittedCaller: Sendable, Equatable {
    var auth: KeyCheck
    var companyID: UUID?
    var userID: UUID?
    var role: UserIdentity.Role?

    init(auth: KeyCheck, companyID: UUID? = nil, userID: UUID? = nil, role: UserIdentity.Role? = nil) {
        self.auth = auth
        self.companyID = companyID
        self.userID = userID
        self.role = role
    }

    init(_ row: AdmittedCells) throws {
        self.init(
            auth: KeyCheck(sql: try row.decode(.auth)), companyID: try row.decode(.companyID), userID: try row.decode(.userID),
            role: try row.decode(.role, as: String?.self).map(UserIdentity.Role.init(sql:)))
    }
}

/// The plan period the call was decided in and its unit counters, as they stand after it (nil:
/// no period, or a counter not reached).
struct AdmittedPeriod: Sendable, Equatable {
    var periodID: Int64?
    var plan: String?
    var planName: String?
    var start: Date?
    var end: Date?
    var companyUsed: Int64?
    var companyCap: Int64?
    var userUsed: Int64?
    var userCap: Int64?

    init(_ row: AdmittedCells) throws {
        periodID = try row.decode(.periodID)
        plan = try row.decode(.planID)
        planName = try row.decode(.planName)
        start = try row.decode(.periodStart)
        end = try row.decode(.periodEnd)
        companyUsed = try row.decode(.companyUsed)
        companyCap = try row.decode(.companyCap)
        userUsed = try row.decode(.userUsed)
        userCap = try row.decode(.userCap)
    }
}

extension FeatureState {
    /// `feature_*`, `day_*` and the four windows' `fc_*` / `fu_*`; nil when the call has no feature.
    init?(admitted row: AdmittedCells) throws {
        guard let id: String = try row.decode(.featureID) else { return nil }
        let refused: String? = try row.decode(.featureRefused)
        self.init(
            id: id, name: try row.decode(.featureName) ?? id, refused: refused.flatMap(Kind.init(sql:)),
            message: try row.decode(.featureMessage), dayStart: try row.decode(.dayStart), dayEnd: try row.decode(.dayEnd),
            values: try Self.admittedValues(row))
    }

    /// The used and limit columns of the four windows, in ``Kind/lockOrder``.
    static func admittedValues(_ row: AdmittedCells) throws -> [(used: Int64?, limit: Int64?)] {
        let columns: [(used: AdmittedColumn, limit: AdmittedColumn)] = [
            (.companyPeriodUsed, .companyPeriodLimit), (.companyDayUsed, .companyDayLimit),
            (.userPeriodUsed, .userPeriodLimit), (.userDayUsed, .userDayLimit),
        ]
        return try columns.map { (used: try row.decode($0.used, as: Int64?.self), limit: try row.decode($0.limit, as: Int64?.self)) }
    }
}

extension StoredAnswer {
    /// `answer_*`: the answer kept under the call's `Idempotency-Key`; nil unless replayed.
    init?(admitted row: AdmittedCells) throws {
        guard let status: Int64 = try row.decode(.answerStatus) else { return nil }
        self.init(status: Int(status), contentType: try row.decode(.answerType), body: try row.decode(.answerBody) ?? ByteBuffer())
    }
}

extension UpgradeOffer {
    /// `upgrade_*`: the plan a refusal offers; nil when none is offered.
    init?(admitted row: AdmittedCells) throws {
        guard let plan: String = try row.decode(.upgradePlan) else { return nil }
        self.init(
            upgrade: .init(plan: plan, companyLimit: try row.decode(.upgradeCompanyCap), userLimit: try row.decode(.upgradeUserCap)),
            featureLimit: try row.decode(.upgradeFeatureLimit))
    }
}

extension CostState {
    /// `hold` and the company's (`cc_*`) and the user's (`uc_*`) cost counters; nil when neither
    /// counter was reached.
    init?(admitted row: AdmittedCells) throws {
        let companyUsed: Int64? = try row.decode(.companyCostUsed)
        let userUsed: Int64? = try row.decode(.userCostUsed)
        guard companyUsed != nil || userUsed != nil else { return nil }
        let company = try companyUsed.map {
            Counter(used: $0, held: try row.decode(.companyCostHeld) ?? 0, limit: try row.decode(.companyBudget))
        }
        let user = try userUsed.map { Counter(used: $0, held: try row.decode(.userCostHeld) ?? 0, limit: try row.decode(.userBudget)) }
        self.init(company: company, user: user, hold: try row.decode(.hold))
    }
}

extension RateState {
    /// `rate_*`, the plan's limits and counts and those of the call's feature (`featureID`);
    /// nil when the call reached no rate window.
    init?(admitted row: AdmittedCells, feature featureID: String?) throws {
        guard let minute: Date = try row.decode(.rateMinute) else { return nil }
        let refused = Refused(sql: try row.decode(.rateRefused))
        let featureLimits = try Limits(admitted: row, .featureLimits)
        var feature: FeatureWindows?
        if let featureID, !featureLimits.isEmpty {
            feature = FeatureWindows(id: featureID, limits: featureLimits, counts: try Counts(admitted: row, .featureCounts))
        }
        self.init(
            limits: try Limits(admitted: row, .planLimits), minute: minute, counts: try Counts(admitted: row, .planCounts),
            feature: feature, refused: refused?.window, refusedFeature: refused?.feature ?? false, tokens: try row.decode(.rateTokens))
    }
}

extension RateState.Limits {
    /// One owner's five limits (NULL: none).
    init(admitted row: AdmittedCells, _ columns: RateColumns) throws {
        self.init(
            companyRPM: try row.decode(columns.companyRPM), companyTPM: try row.decode(columns.companyTPM),
            userRPM: try row.decode(columns.userRPM), userTPM: try row.decode(columns.userTPM),
            userConcurrency: try row.decode(columns.userConcurrency))
    }
}

extension RateState.Counts {
    /// One owner's counts in the minute and its calls in flight (NULL: that window is not set).
    init(admitted row: AdmittedCells, _ columns: RateColumns) throws {
        self.init(
            companyCalls: try row.decode(columns.companyRPM), companyTokens: try row.decode(columns.companyTPM),
            userCalls: try row.decode(columns.userRPM), userTokens: try row.decode(columns.userTPM),
            userInFlight: try row.decode(columns.userConcurrency))
    }
}
