import CapGate
import Foundation
import Testing

/// CapGate's App Store verifier against Apple's own App Store Server Library for Python
/// (`app-store-server-library`, in the test tools' environment): for every case, both accept or
/// both refuse.
@Suite("App Store verification agrees with Apple's library", .timeLimit(.minutes(5)))
struct AppStoreCrossCheckTests {
    /// Apple's `SignedDataVerifier` (offline: the chain at `signedDate`) for each environment
    /// CapGate accepts; a notification's nested transaction and renewal info verified too.
    /// Prints one line: a JSON list of true (accepted) or false.
    static let script = """
        import base64, json, sys
        from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier, VerificationException
        from appstoreserverlibrary.models.Environment import Environment
        spec = json.loads(open(sys.argv[1]).read())
        roots = [base64.b64decode("".join(l for l in open(spec["root"]).read().splitlines() if "-----" not in l))]
        verifiers = [SignedDataVerifier(roots, False, Environment(e), spec["bundle"], spec["app_id"]) for e in spec["environments"]]
        def accepts(v, case):
            try:
                if case["kind"] == "transaction":
                    v.verify_and_decode_signed_transaction(case["jws"])
                    return True
                n = v.verify_and_decode_notification(case["jws"])
                if n.data and n.data.signedTransactionInfo:
                    v.verify_and_decode_signed_transaction(n.data.signedTransactionInfo)
                if n.data and n.data.signedRenewalInfo:
                    v.verify_and_decode_renewal_info(n.data.signedRenewalInfo)
                return True
            except VerificationException:
                return False
        print(json.dumps([any(accepts(v, case) for v in verifiers) for case in spec["cases"]]))
        """

    struct Case {
        var name: String
        var kind: String
        var jws: String
        var accepted: Bool
    }

    static func cases(_ f: AppleFixture, token: UUID) throws -> [Case] {
        let signer = f.signer
        var cases: [Case] = []
        func notification(_ name: String, _ accepted: Bool, _ jws: String) {
            cases.append(Case(name: name, kind: "notification", jws: jws, accepted: accepted))
        }
        func transaction(_ name: String, _ accepted: Bool, _ jws: String) {
            cases.append(Case(name: name, kind: "transaction", jws: jws, accepted: accepted))
        }
        let tx = try f.transaction("x1", token: token)
        let renewal = try f.renewal(original: "x1")
        let fields = f.notificationFields("DID_RENEW", transaction: tx, renewal: renewal)
        let real = try signer.sign(fields)
        notification("valid", true, real)
        var forged = fields
        forged["notificationType"] = "REFUND"
        notification("tampered payload", false, try f.tampered(real, forged))
        var forgedTx = f.transactionFields("x1", token: token)
        forgedTx["expiresDate"] = AppleTestSigner.millis(f.now + 86400 * 3650)
        var nested = fields
        nested["data"] = (fields["data"] as! [String: Any]).merging(["signedTransactionInfo": try f.tampered(tx, forgedTx)]) { $1 }
        notification("tampered nested transaction", false, try signer.sign(nested))
        var forgedRenewal = nested
        forgedRenewal["data"] = (fields["data"] as! [String: Any]).merging(
            ["signedRenewalInfo": try f.tampered(renewal, ["originalTransactionId": "x1", "environment": "Production", "signedDate": 1])]) {
                $1
            }
        notification("tampered nested renewal info", false, try signer.sign(forgedRenewal))
        notification("wrong root", false, try f.notification("DID_RENEW", transaction: tx, chain: signer.otherRoot))
        notification("expired leaf at signedDate", false, try f.notification("TEST", chain: signer.expiredLeaf))
        notification(
            "expired leaf, signed while valid", true, try f.notification("TEST", signed: f.now - 86400 * 1.5, chain: signer.expiredLeaf))
        notification("leaf without OID", false, try f.notification("TEST", chain: signer.leafWithoutOID))
        notification("intermediate without OID", false, try f.notification("TEST", chain: signer.intermediateWithoutOID))
        notification("wrong bundle id", false, try f.notification("TEST", bundle: "com.example.other"))
        notification(
            "nested transaction of another bundle", false,
            try f.notification("DID_RENEW", transaction: try f.transaction("x2", token: token, bundle: "com.example.other")))
        notification("wrong appAppleId in Production", false, try f.notification("TEST", appID: 42))
        notification(
            "Sandbox", true,
            try f.notification(
                "SUBSCRIBED", transaction: try f.transaction("x3", token: token, environment: "Sandbox"), environment: "Sandbox",
                appID: nil))
        notification(
            "Sandbox notification, Production transaction", false,
            try f.notification("SUBSCRIBED", transaction: try f.transaction("x4", token: token), environment: "Sandbox", appID: nil))
        notification("an environment not accepted", false, try f.notification("TEST", environment: "Xcode"))
        // bundleId: required in a transaction and a notification's data (Apple's INVALID_APP_IDENTIFIER);
        // renewal info has none in Apple's payloads (the valid case above carries one without it).
        notification("notification without bundleId", false, try f.notification("TEST", bundle: nil))
        notification(
            "nested transaction without bundleId", false,
            try f.notification("DID_RENEW", transaction: try f.transaction("x12", token: token, bundle: nil)))
        transaction("transaction without bundleId", false, try f.transaction("x13", token: token, bundle: nil))
        transaction(
            "revoked transaction (a refund: it verifies)", true, try f.transaction("x14", token: token, revoked: f.now - 60))
        transaction("transaction", true, try f.transaction("x5", token: token))
        transaction("transaction, Sandbox", true, try f.transaction("x6", token: token, environment: "Sandbox"))
        transaction("transaction, tampered", false, try f.tampered(try f.transaction("x7", token: token), forgedTx))
        transaction("transaction, wrong root", false, try f.transaction("x8", token: token, chain: signer.otherRoot))
        transaction("transaction, expired leaf", false, try f.transaction("x9", token: token, chain: signer.expiredLeaf))
        transaction("transaction, leaf without OID", false, try f.transaction("x10", token: token, chain: signer.leafWithoutOID))
        transaction("transaction, another bundle", false, try f.transaction("x11", token: token, bundle: "com.example.other"))
        return cases
    }

    @Test("every verification case: CapGate and Apple's App Store Server Library both accept or both refuse")
    func crossCheck() async throws {
        try await Harness.with(settings: AppleFixture.settings(environments: "Production,Sandbox")) { h in
            try await AppStoreTests.products(h)
            let f = AppleFixture()
            let (company, users) = try await h.createCompany(plan: "free", users: 1)
            let cases = try Self.cases(f, token: try await h.appAccountToken(company))
            var capgate: [Bool] = []
            for item in cases {
                let reply =
                    item.kind == "transaction"
                    ? try await h.appleTransaction(item.jws, key: users[0].key) : try await h.appleNotification(item.jws)
                #expect(reply.status == 200 || reply.status == 400, "\(item.name): \(reply.body)")
                capgate.append(reply.status == 200)
            }
            let spec = NSTemporaryDirectory() + "capgate-apple-cases-\(UUID().uuidString).json"
            let body = try JSONSerialization.data(withJSONObject: [
                "root": f.signer.rootFile, "bundle": AppleFixture.bundle, "app_id": AppleFixture.appID,
                "environments": ["Production", "Sandbox"], "cases": cases.map { ["kind": $0.kind, "jws": $0.jws] },
            ])
            try body.write(to: URL(fileURLWithPath: spec))
            defer { try? FileManager.default.removeItem(atPath: spec) }
            let python = try await PythonTools.python()
            let (status, output) = try await SDKTests.run(python, ["-c", Self.script, spec])
            try #require(status == 0, "\(output)")
            let last = output.split(separator: "\n").last.map(String.init) ?? ""
            let apple = try #require(try JSONSerialization.jsonObject(with: Data(last.utf8)) as? [Bool], "\(output)")
            try #require(apple.count == cases.count)
            for (index, item) in cases.enumerated() {
                #expect(capgate[index] == apple[index], "\(item.name): CapGate \(capgate[index]), Apple's library \(apple[index])")
                #expect(capgate[index] == item.accepted, "\(item.name): CapGate \(capgate[index])")
            }
        }
    }
}
