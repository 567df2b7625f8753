import Foundation
import Hummingbird
import Testing

@testable import CapGate

@Suite("OpenAPI document", .timeLimit(.minutes(5)))
struct OpenAPITests {
    /// (method, path) pairs of openapi.yaml, read with PyYAML.
    static func documentedRoutes() async throws -> Set<String> {
        let script = """
            import json, sys, yaml
            doc = yaml.safe_load(open(sys.argv[1]))
            print(json.dumps(sorted(f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops if m in ("get","post","put","patch","delete"))))
            """
        let python = try await PythonTools.python()
        let (status, output) = try await SDKTests.run(python, ["-c", script, SDKTests.root.appendingPathComponent("openapi.yaml").path])
        try #require(status == 0, "\(output)")
        let json = try JSON.parse(Array(output.utf8))
        return Set(json.arrayValue?.compactMap(\.stringValue) ?? [])
    }

    @Test("every route the router has is in openapi.yaml, and every documented route exists")
    func routesDocumented() async throws {
        try await Harness.with { h in
            let configuration = try await CapGateConfiguration.load(
                flags: ["database.url": h.databaseURL.text, "upstream.url": h.mockURL], environment: [:], file: "/nonexistent.json"
            )
            let routes = try await routerRoutes(configuration: configuration)
            let documented = try await Self.documentedRoutes()
            #expect(!routes.isEmpty)
            for route in routes {
                #expect(documented.contains(route), "\(route) is not in openapi.yaml")
            }
            for route in documented {
                #expect(routes.contains(route), "openapi.yaml documents \(route), which the router does not have")
            }
        }
    }

    @Test("GET /openapi.yaml serves the document")
    func served() async throws {
        try await Harness.with { h in
            let reply = try await h.request(.GET, "/openapi.yaml")
            #expect(reply.status == 200)
            #expect(reply.body.hasPrefix("openapi: 3.1"))
        }
    }

    /// Every schemathesis check but two: `ignored_auth` (the operator token is passed as a plain
    /// header, which schemathesis keeps when it drops "the credentials") and
    /// `positive_data_acceptance` (cross-field rules a schema cannot state, such as `from` after
    /// `to`, are documented and answered 400).
    @Test("schemathesis finds no 5xx, no answer outside the schema, no schema-invalid input accepted, 405 for other methods")
    func schemathesis() async throws {
        let python = try await PythonTools.python()
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25, isDefault: true)
            _ = try await h.createCompany(plan: "low", users: 2, role: "admin")
            let (status, output) = try await SDKTests.run(
                python,
                [
                    "-m", "schemathesis.cli", "run", SDKTests.root.appendingPathComponent("openapi.yaml").path,
                    "--url", h.gatewayURL, "--header", "Authorization: Bearer \(h.operatorToken)",
                    "--checks", "all", "--exclude-checks", "ignored_auth,positive_data_acceptance",
                    "--max-examples", "25", "--seed", "1", "--no-color",
                ]
            )
            #expect(status == 0, "\(output.suffix(6000))")
        }
    }
}
