import Foundation

extension OperatorRoutes {
    /// The longest a top-up may last: 100 years, in days.
    static let maxValidDays: Int64 = 36_600

    /// A `POST /admin/v1/products` body (SPEC §5, §12): `kind` `subscription` (the default:
    /// `plan_id` required, `interval` `month` or `year`) or `topup` (`plan_id` and `interval`
    /// null or absent; `units` a whole number from 1 and/or `budget` a decimal string of USD above
    /// 0; `valid_days` from 1 to 36,600, default 365). A field the kind does not take is 400
    /// naming it, never ignored: a subscription posted with `units` would otherwise grant nothing
    /// the operator expects.
    static func productInput(_ fields: BodyFields) throws -> ProductRecord {
        let id = try fields.requiredString("product_id")
        let kindText = try fields.string("kind", maxLength: 20) ?? ProductRecord.Kind.subscription.rawValue
        guard let kind = ProductRecord.Kind(rawValue: kindText) else {
            throw GatewayError.invalidRequest("'kind' must be 'subscription' or 'topup'.")
        }
        switch kind {
        case .subscription:
            for key in ["units", "budget", "valid_days"] where fields.fields[key].map({ !$0.isNull }) == true {
                throw GatewayError.invalidRequest("'\(key)' is a field of top-up products (kind 'topup'), not of subscriptions.")
            }
            let plan = try fields.requiredString("plan_id", maxLength: 64)
            let interval = try fields.string("interval", maxLength: 10) ?? "month"
            guard interval == "month" || interval == "year" else {
                throw GatewayError.invalidRequest("'interval' must be 'month' or 'year'.")
            }
            return ProductRecord(productID: id, planID: plan, interval: interval)
        case .topup:
            for key in ["plan_id", "interval"] where fields.fields[key].map({ !$0.isNull }) == true {
                throw GatewayError.invalidRequest("A top-up product has no plan and no interval: '\(key)' must be null or absent.")
            }
            let units = try fields.int("units", range: 1...BodyFields.maxCap)
            var budget: Micros? = nil
            switch try fields.budget("budget") {
            case .absent, .null: break
            case .value(let amount) where amount.value > 0: budget = amount
            case .value: throw GatewayError.invalidRequest("'budget' must be more than \"0\" (or null when the pack grants only units).")
            }
            guard units != nil || budget != nil else {
                throw GatewayError.invalidRequest("A top-up grants 'units' and/or 'budget': give at least one of them.")
            }
            let days = try fields.int("valid_days", range: 1...maxValidDays) ?? 365
            return ProductRecord(productID: id, planID: nil, interval: nil, kind: .topup, units: units, budget: budget, validDays: days)
        }
    }
}
