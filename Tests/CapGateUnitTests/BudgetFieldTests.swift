import Foundation
import Testing

@testable import CapGate

/// SPEC §11's budget fields as the operator API reads and writes them: decimal strings of US
/// dollars read exactly (`null` unlimited, absent unchanged), anything else 400 naming the field.
@Suite("Budget fields: exact decimal strings in, shortest decimal strings out")
struct BudgetFieldTests {
    static func fields(_ value: JSON?) -> BodyFields {
        BodyFields(fields: value.map { ["monthly_budget": $0] } ?? [:], containsNUL: false)
    }

    @Test("reads decimal strings exactly; null is unlimited; absent keeps the current budget")
    func reads() throws {
        let cases: [(String, Int64)] = [
            ("0", 0), ("0.000001", 1), ("12.5", 12_500_000), ("12.345678", 12_345_678), ("50", 50_000_000),
            ("1000000", 1_000_000_000_000), ("1.500000", 1_500_000), ("999999999.999999", 999_999_999_999_999),
        ]
        for (text, micros) in cases {
            #expect(try Self.fields(.string(text)).budget("monthly_budget") == .value(Micros(micros)), "\(text)")
            #expect(try Self.fields(.string(text)).budget("monthly_budget", keeping: Micros(7)) == Micros(micros))
        }
        #expect(try Self.fields(.null).budget("monthly_budget") == .null)
        #expect(try Self.fields(.null).budget("monthly_budget", keeping: Micros(7)) == nil)
        #expect(try Self.fields(nil).budget("monthly_budget") == .absent)
        #expect(try Self.fields(nil).budget("monthly_budget", keeping: Micros(7)) == Micros(7))
        #expect(try Self.fields(nil).budget("monthly_budget", keeping: nil) == nil)
    }

    @Test("a JSON number, a sign, an exponent, a 7th decimal, too large or garbage is 400 naming the field")
    func refuses() {
        let bad: [JSON] = [
            .int(5), .double(12.5), .int(0), .string("-1"), .string("+1"), .string("1e3"), .string("0.0000001"),
            .string("1000000000"), .string(""), .string(" 5"), .string("5 "), .string("five"), .string("05"), .string(".5"),
            .string("5."), .string("1,5"), .string("NaN"), .bool(true), .array([.string("5")]), .obj(["usd": .string("5")]),
        ]
        for value in bad {
            #expect(throws: GatewayError.self, "\(value.serialized())") {
                try Self.fields(value).budget("monthly_budget", keeping: Micros(7))
            }
            do {
                _ = try Self.fields(value).budget("monthly_budget")
            } catch let error as GatewayError {
                #expect(error.status == .badRequest)
                #expect(error.message.contains("'monthly_budget'"), "\(error.message)")
            } catch {
                Issue.record("\(value.serialized()): \(error)")
            }
        }
    }

    @Test("plans and users write budgets as shortest decimal strings, null when unlimited")
    func writes() throws {
        var plan = PlanRecord(
            id: "p", name: "P", monthlyCompanyCap: nil, monthlyUserCap: nil, price: 0, currency: "USD", isDefault: false,
            isActive: true, sortOrder: 0, monthlyCompanyBudget: Micros(1), monthlyUserBudget: nil)
        var text = String(decoding: try wireJSON(plan), as: UTF8.self)
        #expect(text.contains(#""monthly_company_budget":"0.000001","#))
        #expect(text.contains(#""monthly_user_budget":null,"#))
        for (micros, shown) in [(12_500_000, "12.5"), (1_000_000_000_000, "1000000"), (0, "0"), (12_345_678, "12.345678")] {
            plan.monthlyUserBudget = Micros(Int64(micros))
            text = String(decoding: try wireJSON(plan), as: UTF8.self)
            #expect(text.contains(#""monthly_user_budget":"\#(shown)","#), "\(text)")
        }
        let user = UserRecord(
            id: UUID(), companyID: UUID(), email: nil, role: "member", monthlyCap: nil, disabled: false, createdAt: Date(),
            monthlyBudget: Micros(12_500_000))
        #expect(String(decoding: try wireJSON(user), as: UTF8.self).contains(#""monthly_budget":"12.5","#))
    }
}
