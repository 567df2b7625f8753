import Foundation
import NIOCore
import PostgresNIO
import Testing

@testable import CapGate

/// A `capgate_admitted` row read in its parts (Storage/AdmittedRow.swift), from rows built here
/// in PostgreSQL's binary format: each column lands in its own field, NULL is nil, an absent
/// part is nil, and the kinds are enums. Every value set is distinct, so a column read in the
/// place of another shows.
@Suite("The admission row, typed at the border")
struct AdmittedRowTests {
    /// A row of `AdmittedColumn.names`, NULL where nothing is set.
    struct Row {
        var values: [String: (bytes: ByteBuffer, type: PostgresDataType)] = [:]

        init(_ values: [String: any PostgresEncodable] = [:]) throws {
            for (name, value) in values { try set(name, value) }
        }

        mutating func set(_ name: String, _ value: any PostgresEncodable) throws {
            try #require(AdmittedColumn.names.contains(name), "\(name)")
            var bytes = ByteBuffer()
            try value.encode(into: &bytes, context: .default)
            values[name] = (bytes, value.psqlType)
        }

        func cells() throws -> AdmittedCells {
            try AdmittedCells(
                cells: AdmittedColumn.names.enumerated().map { index, name in
                    PostgresCell(
                        bytes: values[name]?.bytes, dataType: values[name]?.type ?? .text, format: .binary, columnName: name,
                        columnIndex: index)
                })
        }

        func admitted() throws -> AdmissionRow { try AdmissionRow(admitted: cells()) }
    }

    static let company = UUID(uuidString: "11111111-2222-3333-4444-555555555555")!
    static let user = UUID(uuidString: "66666666-7777-8888-9999-000000000000")!
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    static let minute = Date(timeIntervalSince1970: 1_800_000_060)

    /// A charged call as `capgate_admit` answers it: period, counters, plan windows, no feature.
    static func charged() throws -> Row {
        try Row([
            "item": Int32(1), "auth": "ok", "company_id": company, "user_id": user, "role": "admin", "decision": "charged",
            "ledger_id": Int64(901), "period_id": Int64(77), "plan_id": "pro", "plan_name": "Pro", "period_start": start,
            "period_end": start.addingTimeInterval(86_400), "company_used": Int64(12), "company_cap": Int64(100),
            "user_used": Int64(3), "user_cap": Int64(10),
        ])
    }

    @Test("the columns are the type's, in its order, each named once; every named column resolves to its own position")
    func columns() throws {
        let names = AdmittedColumn.names
        #expect(names.count == 68 && Set(names).count == 68)
        #expect(AdmittedColumn.selectList == names.joined(separator: ", "))
        let type = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("db/functions/capgate_admission.type.sql")
        let sql = try String(contentsOf: type, encoding: .utf8)
        let body = try #require(sql.range(of: "CREATE TYPE capgate_admitted AS (")).upperBound
        let end = try #require(sql.range(of: ");", range: body..<sql.endIndex)).lowerBound
        let declared = sql[body..<end].split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: " ").first.map(String.init) ?? ""
        }
        #expect(declared == names)
        let columns: [AdmittedColumn] = [.auth, .decision, .ledgerID, .featureRefused, .answerBody, .budgetScope, .rateTokens]
        for column in columns {
            #expect(names[column.index] == column.name)
        }
        #expect(AdmittedColumn.auth.index == 1 && AdmittedColumn.rateTokens.name == "rate_tokens")
        for set in [RateColumns.planLimits, .planCounts, .featureLimits, .featureCounts] {
            let indices = [set.companyRPM, set.companyTPM, set.userRPM, set.userTPM, set.userConcurrency].map(\.index)
            #expect(indices == Array(indices[0]..<indices[0] + 5), "\(indices)")
        }
        #expect(RateColumns.featureCounts.userConcurrency.index == 67)
    }

    @Test("a row of another shape is refused")
    func wrongShape() {
        #expect(throws: DatabaseError.self) { try AdmittedCells(cells: []) }
    }

    @Test("a key refused: its check, nothing else; no part is read into being")
    func refusedKey() throws {
        for (text, check) in [("revoked_key", KeyCheck.revokedKey), ("disabled_user", .disabledUser), ("something_new", .unknownKey)] {
            let row = try Row(["item": Int32(1), "auth": text]).admitted()
            #expect(row.caller == AdmittedCaller(auth: check))
            #expect(row.decision == nil && row.ledgerID == nil && row.budgetScope == nil)
            #expect(row.period.periodID == nil && row.period.plan == nil && row.period.companyUsed == nil)
            #expect(row.feature == nil && row.answer == nil && row.upgrade == nil && row.cost == nil && row.rate == nil)
        }
    }

    @Test("a charge: the caller, the decision, the ledger row, the period and its counters")
    func charge() throws {
        let row = try Self.charged().admitted()
        #expect(row.caller == AdmittedCaller(auth: .ok, companyID: Self.company, userID: Self.user, role: .admin))
        #expect(row.decision == .charged && row.ledgerID == 901 && row.budgetScope == nil)
        let period = row.period
        #expect(period.periodID == 77 && period.plan == "pro" && period.planName == "Pro")
        #expect(period.start == Self.start && period.end == Self.start.addingTimeInterval(86_400))
        #expect(period.companyUsed == 12 && period.companyCap == 100 && period.userUsed == 3 && period.userCap == 10)
        #expect(row.feature == nil && row.answer == nil && row.upgrade == nil && row.cost == nil && row.rate == nil)

        var member = try Self.charged()
        try member.set("role", "member")
        try member.set("decision", "a_decision_not_known")
        let unknown = try member.admitted()
        #expect(unknown.caller.role == .member && unknown.decision == nil)
    }

    @Test("a feature: its name, message, day, the four windows in the lock order, the refusing one")
    func feature() throws {
        var row = try Self.charged()
        try row.set("decision", "feature_limit_exceeded")
        for (name, value) in [
            ("fc_period_used", 20), ("fc_period_limit", 21), ("fc_day_used", 22), ("fu_period_used", 24), ("fu_period_limit", 25),
            ("fu_day_used", 26), ("fu_day_limit", 27), ("upgrade_feature_limit", 50), ("upgrade_company_cap", 1_000),
        ] {
            try row.set(name, Int64(value))
        }
        try row.set("feature_id", "analysis")
        try row.set("feature_refused", "user.day")
        try row.set("feature_message", "Ask for more.")
        try row.set("day_start", Self.start)
        try row.set("day_end", Self.minute)
        try row.set("upgrade_plan", "team")
        let admitted = try row.admitted()
        #expect(admitted.decision == .featureLimitExceeded)
        let feature = try #require(admitted.feature)
        #expect(feature.id == "analysis" && feature.name == "analysis" && feature.message == "Ask for more.")
        #expect(feature.dayStart == Self.start && feature.dayEnd == Self.minute)
        #expect(feature.counters.map(\.kind) == FeatureState.Kind.lockOrder)
        #expect(feature.counters.map(\.used) == [20, 22, 24, 26] && feature.counters.map(\.limit) == [21, nil, 25, 27])
        #expect(feature.refused?.kind == FeatureState.Kind(.user, .day) && feature.refused?.used == 26)
        let upgrade = try #require(admitted.upgrade)
        #expect(upgrade.upgrade.plan == "team" && upgrade.upgrade.companyLimit == 1_000 && upgrade.upgrade.userLimit == nil)
        #expect(upgrade.featureLimit == 50)

        try row.set("feature_name", "Analysis")
        try row.set("feature_refused", "team.week")
        let renamed = try #require(try row.admitted().feature)
        #expect(renamed.name == "Analysis" && renamed.refused == nil)
    }

    @Test("a replay: the stored answer, an empty body for NULL")
    func replay() throws {
        var row = try Self.charged()
        try row.set("decision", "idempotency_replay")
        try row.set("answer_status", Int32(201))
        try row.set("answer_type", "application/json")
        try row.set("answer_body", ByteBuffer(string: "{}"))
        let answer = try #require(try row.admitted().answer)
        #expect(answer.status == 201 && answer.contentType == "application/json" && answer.body == ByteBuffer(string: "{}"))

        var bare = try Self.charged()
        try bare.set("answer_status", Int32(204))
        let empty = try #require(try bare.admitted().answer)
        #expect(empty.status == 204 && empty.contentType == nil && empty.body.readableBytes == 0)
    }

    @Test("a budget refusal: the hold, both cost counters (held 0 for NULL), whose budget refused")
    func budget() throws {
        var row = try Self.charged()
        try row.set("decision", "budget_exceeded")
        try row.set("budget_scope", "user")
        for (name, value) in [("hold", 5_000), ("cc_used", 100), ("cc_held", 200), ("cc_limit", 300), ("uc_used", 400), ("uc_limit", 600)] {
            try row.set(name, Int64(value))
        }
        let admitted = try row.admitted()
        #expect(admitted.decision == .budgetExceeded && admitted.budgetScope == .user)
        #expect(
            admitted.cost
                == CostState(
                    company: .init(used: 100, held: 200, limit: 300), user: .init(used: 400, held: 0, limit: 600), hold: 5_000))

        var companyOnly = try Self.charged()
        try companyOnly.set("cc_used", Int64(7))
        try companyOnly.set("budget_scope", "team")
        let company = try companyOnly.admitted()
        #expect(company.cost == CostState(company: .init(used: 7, held: 0, limit: nil), user: nil, hold: nil))
        #expect(company.budgetScope == nil)
    }

    @Test("rate windows: the plan's limits (integer and bigint columns) and counts, the feature's, the refusing window")
    func rate() throws {
        var row = try Self.charged()
        try row.set("decision", "rate_limited")
        try row.set("feature_id", "analysis")
        try row.set("rate_refused", "feature.user-concurrency")
        try row.set("rate_minute", Self.minute)
        try row.set("rate_tokens", Int64(4_000))
        for (name, value) in [
            ("company_rpm", 30), ("user_rpm", 32), ("user_concurrency", 34), ("f_user_rpm", 52), ("f_user_concurrency", 54),
        ] {
            try row.set(name, Int32(value))
        }
        for (name, value) in [
            ("company_tpm", 31), ("user_tpm", 33), ("cr_calls", 40), ("cr_tokens", 41), ("ur_calls", 42), ("ur_tokens", 43),
            ("u_slots", 44), ("f_company_tpm", 51), ("fcr_calls", 60), ("fcr_tokens", 61), ("fur_calls", 62), ("fur_tokens", 63),
            ("fu_slots", 64),
        ] {
            try row.set(name, Int64(value))
        }
        let rate = try #require(try row.admitted().rate)
        #expect(rate.minute == Self.minute && rate.tokens == 4_000)
        #expect(rate.limits == .init(companyRPM: 30, companyTPM: 31, userRPM: 32, userTPM: 33, userConcurrency: 34))
        #expect(rate.counts == .init(companyCalls: 40, companyTokens: 41, userCalls: 42, userTokens: 43, userInFlight: 44))
        let feature = try #require(rate.feature)
        #expect(feature.id == "analysis")
        #expect(feature.limits == .init(companyTPM: 51, userRPM: 52, userConcurrency: 54))
        #expect(feature.counts == .init(companyCalls: 60, companyTokens: 61, userCalls: 62, userTokens: 63, userInFlight: 64))
        #expect(rate.refused == .userConcurrency && rate.refusedFeature)

        // The plan's window; a feature without limits of its own has no windows.
        for name in ["f_company_tpm", "f_user_rpm", "f_user_concurrency"] { row.values[name] = nil }
        try row.set("rate_refused", "company-tpm")
        let plan = try #require(try row.admitted().rate)
        #expect(plan.feature == nil && plan.refused == .companyTPM && !plan.refusedFeature)
        try row.set("rate_refused", "feature.a-window-not-known")
        let unknown = try #require(try row.admitted().rate)
        #expect(unknown.refused == nil && !unknown.refusedFeature)
    }

    @Test("a call that reached no rate window has none, whatever else the row holds")
    func noRate() throws {
        var row = try Self.charged()
        try row.set("company_rpm", Int32(30))
        try row.set("rate_refused", "user-rpm")
        #expect(try row.admitted().rate == nil)
    }
}
