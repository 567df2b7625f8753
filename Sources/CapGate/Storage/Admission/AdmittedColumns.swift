import PostgresNIO

/// A column of a `capgate_admitted` row (db/functions/capgate_admission.type.sql), read by its
/// name through a position resolved once.
///
/// The admission statements select ``names`` in this order (``selectList``), so a column's
/// position in the answer is its position here, whatever the type's own order. Each column is a
/// `static let` below, resolved on first use (a failed lookup is a programming error, caught by
/// the first test that admits a call); reading a row then costs an array index per column, where
/// `PostgresRandomAccessRow["name"]` would hash a string in the row's lookup table for each of the
/// 68 columns of every admitted call.
struct AdmittedColumn: Sendable, Equatable {
    let name: String
    let index: Int

    init(_ name: String) {
        guard let index = Self.names.firstIndex(of: name) else {
            preconditionFailure("capgate_admitted has no column \(name)")
        }
        self.name = name
        self.index = index
    }

    /// The columns of `capgate_admitted`, in the order the admission statements select them.
    static let names: [String] = [
        "item", "auth", "company_id", "user_id", "role", "decision", "ledger_id", "period_id", "plan_id", "plan_name",
        "period_start", "period_end", "company_used", "company_cap", "user_used", "user_cap",
        "feature_id", "feature_name", "feature_refused", "feature_message", "day_start", "day_end",
        "fc_period_used", "fc_period_limit", "fc_day_used", "fc_day_limit", "fu_period_used", "fu_period_limit",
        "fu_day_used", "fu_day_limit", "answer_status", "answer_type", "answer_body",
        "upgrade_plan", "upgrade_company_cap", "upgrade_user_cap", "upgrade_feature_limit",
        "hold", "budget_scope", "cc_used", "cc_held", "cc_limit", "uc_used", "uc_held", "uc_limit",
        "rate_refused", "rate_minute", "rate_tokens", "company_rpm", "company_tpm", "user_rpm", "user_tpm", "user_concurrency",
        "cr_calls", "cr_tokens", "ur_calls", "ur_tokens", "u_slots",
        "f_company_rpm", "f_company_tpm", "f_user_rpm", "f_user_tpm", "f_user_concurrency",
        "fcr_calls", "fcr_tokens", "fur_calls", "fur_tokens", "fu_slots",
    ]

    /// `SELECT`'s list of the admission statements: ``names``, in order.
    static let selectList = names.joined(separator: ", ")
}

/// The cells of one `capgate_admitted` row, read by ``AdmittedColumn``.
struct AdmittedCells: Sendable {
    let cells: [PostgresCell]

    /// The row's cells, in one pass over it; throws when it is not a `capgate_admitted` row of
    /// ``AdmittedColumn/selectList``.
    init(_ row: PostgresRow) throws {
        try self.init(cells: Array(row))
    }

    init(cells: [PostgresCell]) throws {
        guard cells.count == AdmittedColumn.names.count else {
            throw DatabaseError.other("an admission row has \(cells.count) columns, not \(AdmittedColumn.names.count)")
        }
        self.cells = cells
    }

    /// The value of `column`, as `T` (an optional for a column that may be NULL).
    func decode<T: PostgresDecodable>(_ column: AdmittedColumn, as type: T.Type = T.self) throws -> T {
        let cell = cells[column.index]
        assert(cell.columnName == column.name, "column \(column.index) is \(cell.columnName), not \(column.name)")
        return try cell.decode(T.self)
    }
}

extension AdmittedColumn {
    static let auth = Self("auth")
    static let companyID = Self("company_id")
    static let userID = Self("user_id")
    static let role = Self("role")
    static let decision = Self("decision")

    static let ledgerID = Self("ledger_id")
    static let periodID = Self("period_id")
    static let planID = Self("plan_id")
    static let planName = Self("plan_name")
    static let periodStart = Self("period_start")
    static let periodEnd = Self("period_end")
    static let companyUsed = Self("company_used")
    static let companyCap = Self("company_cap")
    static let userUsed = Self("user_used")
    static let userCap = Self("user_cap")

    static let featureID = Self("feature_id")
    static let featureName = Self("feature_name")
    static let featureRefused = Self("feature_refused")
    static let featureMessage = Self("feature_message")
    static let dayStart = Self("day_start")
    static let dayEnd = Self("day_end")
    static let companyPeriodUsed = Self("fc_period_used")
    static let companyPeriodLimit = Self("fc_period_limit")
    static let companyDayUsed = Self("fc_day_used")
    static let companyDayLimit = Self("fc_day_limit")
    static let userPeriodUsed = Self("fu_period_used")
    static let userPeriodLimit = Self("fu_period_limit")
    static let userDayUsed = Self("fu_day_used")
    static let userDayLimit = Self("fu_day_limit")

    static let answerStatus = Self("answer_status")
    static let answerType = Self("answer_type")
    static let answerBody = Self("answer_body")

    static let upgradePlan = Self("upgrade_plan")
    static let upgradeCompanyCap = Self("upgrade_company_cap")
    static let upgradeUserCap = Self("upgrade_user_cap")
    static let upgradeFeatureLimit = Self("upgrade_feature_limit")

    static let hold = Self("hold")
    static let budgetScope = Self("budget_scope")
    static let companyCostUsed = Self("cc_used")
    static let companyCostHeld = Self("cc_held")
    static let companyBudget = Self("cc_limit")
    static let userCostUsed = Self("uc_used")
    static let userCostHeld = Self("uc_held")
    static let userBudget = Self("uc_limit")

    static let rateRefused = Self("rate_refused")
    static let rateMinute = Self("rate_minute")
    static let rateTokens = Self("rate_tokens")
}

/// The five columns of one owner's rate limits (the plan's or the call's feature's) or of its
/// counts in the minute, in ``RateState/Window`` order.
struct RateColumns: Sendable {
    let companyRPM: AdmittedColumn
    let companyTPM: AdmittedColumn
    let userRPM: AdmittedColumn
    let userTPM: AdmittedColumn
    let userConcurrency: AdmittedColumn

    init(_ names: (String, String, String, String, String)) {
        companyRPM = AdmittedColumn(names.0)
        companyTPM = AdmittedColumn(names.1)
        userRPM = AdmittedColumn(names.2)
        userTPM = AdmittedColumn(names.3)
        userConcurrency = AdmittedColumn(names.4)
    }

    /// The plan's limits.
    static let planLimits = Self(("company_rpm", "company_tpm", "user_rpm", "user_tpm", "user_concurrency"))
    /// The counts of the plan's windows and the user's calls in flight.
    static let planCounts = Self(("cr_calls", "cr_tokens", "ur_calls", "ur_tokens", "u_slots"))
    /// The limits the call's feature's entitlement sets.
    static let featureLimits = Self(("f_company_rpm", "f_company_tpm", "f_user_rpm", "f_user_tpm", "f_user_concurrency"))
    /// The counts of the feature's windows and the user's calls of it in flight.
    static let featureCounts = Self(("fcr_calls", "fcr_tokens", "fur_calls", "fur_tokens", "fu_slots"))
}
