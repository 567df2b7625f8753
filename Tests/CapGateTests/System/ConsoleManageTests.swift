import Foundation
import Testing

@testable import CapGate

/// SPEC §13: managing in the console. A real headless Chromium, driven by Selenium, does what a
/// company admin and the operator do with the page against the real gateway and database; the
/// Python checks read the API back after every action (`Tests/console/console_*_check.py`).
@Suite("Console management", .timeLimit(.minutes(5)))
struct ConsoleManageTests {
    /// Runs one check script with the test's gateway; it prints `ok` when every check held.
    static func browserCheck(_ script: String, _ h: Harness, _ environment: [String: String]) async throws {
        let python = try await PythonTools.python()
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium"), "apt-get install -y chromium chromium-driver")
        let folder = SDKTests.root.appendingPathComponent(".build/console-screenshots").path
        let (status, output) = try await SDKTests.run(
            python, [SDKTests.root.appendingPathComponent("Tests/console/\(script)").path],
            environment: environment.merging(["CAPGATE_URL": h.gatewayURL, "SCREENSHOTS": folder, "OPERATOR_TOKEN": h.operatorToken]) {
                a, _ in a
            })
        #expect(status == 0, "\(output)")
        #expect(output.contains(" ok "), "\(output)")
    }

    /// Plans `low` (with the `analysis` feature) and `medium` above it, so `low` has an upgrade offer.
    static func catalog(_ h: Harness) async throws {
        try await h.createPlan("low", company: 400, user: 200, sort: 1)
        try await h.createPlan("medium", company: 4000, user: 2000, sort: 2)
        #expect(try await h.op(.POST, "/admin/v1/features", .obj(["id": "analysis", "name": "Analysis"])).status == 201)
        #expect(try await h.op(.PUT, "/admin/v1/plans/low/entitlements/analysis", .obj([:])).status == 201)
    }

    @Test(
        "a company admin in Chromium: adds and edits users with field errors, creates, rotates and revokes keys (used for real calls), reads the audit log and plan; B out of reach"
    )
    func admin() async throws {
        try await Harness.with { h in
            try await Self.catalog(h)
            let (a, aUsers) = try await h.createCompany(plan: "low", users: 2, role: "admin")
            let (b, bUsers) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(a.text)", .obj(["name": "Acme Skin"])).status == 200)
            #expect(try await h.op(.PATCH, "/admin/v1/companies/\(b.text)", .obj(["name": "Beta Labs"])).status == 200)
            for _ in 0..<3 { #expect(try await h.message(key: aUsers[1].key).status == 200) }
            // A top-up pack bought for A (SPEC §12), for the plan view's list.
            #expect(
                try await h.op(.POST, "/admin/v1/products", .obj(["product_id": "pack.250", "kind": "topup", "units": 250])).status == 201)
            let purchase = try await h.op(
                .POST, "/admin/v1/billing/events",
                .obj([
                    "type": "purchase", "company_id": .string(a.text), "transaction_id": "console-pack-1", "product_id": "pack.250",
                    "purchase_date": JSON(Date()),
                ]))
            #expect((200...201).contains(purchase.status), "\(purchase.body)")
            let bKeys = try await h.op(.GET, "/admin/v1/companies/\(b.text)/api-keys").json["data"]?.arrayValue ?? []
            try await Self.browserCheck(
                "console_admin_check.py", h,
                [
                    "ADMIN_KEY": aUsers[0].key, "MEMBER_ID": aUsers[1].id.text, "COMPANY_A": a.text, "COMPANY_B": b.text,
                    "B_USER_ID": bUsers[0].id.text, "B_KEY_ID": bKeys.first?["id"]?.stringValue ?? "", "B_KEY": bUsers[0].key,
                ])
        }
    }

    @Test(
        "the operator in Chromium: creates a company and assigns plans, edits plans, features, entitlements, routes and the price book with the API's errors beside the field; App Store and audit views"
    )
    func catalogByOperator() async throws {
        try await Harness.with { h in
            try await Self.catalog(h)
            let (a, _) = try await h.createCompany(plan: "low", users: 1, role: "admin")
            try await Self.browserCheck("console_operator_check.py", h, ["COMPANY_A": a.text])
        }
    }
}
