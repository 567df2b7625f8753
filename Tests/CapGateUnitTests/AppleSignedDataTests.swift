import Foundation
import Testing

@testable import CapGate

/// SPEC §12's checks of App Store signed data that need no signature (Billing/Apple/AppleSignedData.swift):
/// the environment among `apple.environments`, `bundleId` required and equal to `apple.bundleId`
/// (renewal info may name none), `appAppleId` in Production; and a JWS refused before its
/// signature is checked when it is not compact, not ES256, has no three-certificate `x5c`, or its
/// payload is not I-JSON. Each refusal says why (it is logged; nothing is applied).
@Suite("App Store signed data: checks before and beside the signature")
struct AppleSignedDataTests {
    static func signedData(bundleID: String? = "com.example.app", environments: [String] = ["Production"]) throws -> AppleSignedData {
        try AppleSignedData(
            settings: AppleSettings(
                bundleID: bundleID, appAppleID: 1_234_567_890, environments: environments, rootCertificates: [AppleSettings.shippedRoot()]))
    }

    /// The refusal's reason, or nil when `body` passed.
    static func reason(_ body: () async throws -> Void) async -> String? {
        do {
            try await body()
            return nil
        } catch let refusal as AppleSignedData.Refusal {
            return refusal.reason
        } catch {
            return "not a refusal: \(error)"
        }
    }

    static func jws(header: String, payload: String) -> String {
        UnitTestSupport.base64URL(Array(header.utf8)) + "." + UnitTestSupport.base64URL(Array(payload.utf8)) + ".c2ln"
    }

    @Test("the environment must be one of apple.environments: Production alone by default; none at all is refused")
    func environments() async throws {
        let data = try Self.signedData()
        #expect(
            await Self.reason {
                try data.check(
                    bundleID: "com.example.app", environment: "Production", appAppleID: nil, what: .transaction("signedTransaction"))
            } == nil)
        #expect(
            await Self.reason {
                try data.check(
                    bundleID: "com.example.app", environment: "Sandbox", appAppleID: nil, what: .transaction("signedTransaction"))
            }
                == "signedTransaction: environment Sandbox is not one of apple.environments")
        #expect(
            await Self.reason { try data.check(bundleID: "com.example.app", environment: nil, appAppleID: nil, what: .renewalInfo) }
                == "signedRenewalInfo: environment (none) is not one of apple.environments")
        let both = try Self.signedData(environments: ["Production", "Sandbox"])
        #expect(
            await Self.reason { try both.check(bundleID: "com.example.app", environment: "Sandbox", appAppleID: nil, what: .notification) }
                == nil)
    }

    @Test("bundleId is required in notifications and transactions and must be apple.bundleId; renewal info may name none")
    func bundles() async throws {
        let data = try Self.signedData()
        let what = AppleSignedData.Checked.transaction("signedTransaction")
        #expect(
            await Self.reason { try data.check(bundleID: nil, environment: "Production", appAppleID: nil, what: what) }
                == "signedTransaction has no bundleId")
        #expect(
            await Self.reason { try data.check(bundleID: "com.other.app", environment: "Production", appAppleID: nil, what: what) }
                == "signedTransaction: bundleId com.other.app is not apple.bundleId")
        #expect(await Self.reason { try data.check(bundleID: nil, environment: "Production", appAppleID: nil, what: .renewalInfo) } == nil)
        #expect(
            await Self.reason { try data.check(bundleID: "com.other.app", environment: "Production", appAppleID: nil, what: .renewalInfo) }
                == "signedRenewalInfo: bundleId com.other.app is not apple.bundleId")
        let unset = try Self.signedData(bundleID: nil)
        #expect(
            await Self.reason { try unset.check(bundleID: "com.example.app", environment: "Production", appAppleID: nil, what: what) }
                == "apple.bundleId is not configured")
    }

    @Test("a Production notification's appAppleId must be apple.appAppleId; a Sandbox one and transactions are not asked")
    func appAppleID() async throws {
        let data = try Self.signedData(environments: ["Production", "Sandbox"])
        #expect(
            await Self.reason {
                try data.check(bundleID: "com.example.app", environment: "Production", appAppleID: 1_234_567_890, what: .notification)
            } == nil)
        for appID: Int64? in [nil, 42] {
            #expect(
                await Self.reason {
                    try data.check(bundleID: "com.example.app", environment: "Production", appAppleID: appID, what: .notification)
                }
                    == "notification: appAppleId is not apple.appAppleId")
        }
        #expect(
            await Self.reason { try data.check(bundleID: "com.example.app", environment: "Sandbox", appAppleID: nil, what: .notification) }
                == nil)
        #expect(
            await Self.reason {
                try data.check(bundleID: "com.example.app", environment: "Production", appAppleID: nil, what: .transaction("t"))
            } == nil)
    }

    @Test("refused before the signature: not a compact JWS, not ES256, an x5c that is not three certificates, a payload that is not I-JSON")
    func refusedUnsigned() async throws {
        let data = try Self.signedData()
        let es256 = #"{"alg":"ES256","x5c":["a","b","c"]}"#
        let cases: [(String, String)] = [
            ("not-a-jws", "signedTransaction is not a compact JWS"), ("a.b", "signedTransaction is not a compact JWS"),
            (Self.jws(header: "[1]", payload: "{}"), "signedTransaction is not a compact JWS"),
            (Self.jws(header: #"{"alg":"HS256","x5c":["a","b","c"]}"#, payload: "{}"), "signedTransaction is signed with HS256, not ES256"),
            (Self.jws(header: #"{"x5c":["a","b","c"]}"#, payload: "{}"), "signedTransaction is signed with (none), not ES256"),
            (
                Self.jws(header: #"{"alg":"ES256","x5c":["a","b"]}"#, payload: "{}"),
                "signedTransaction's x5c is not leaf, intermediate and root"
            ),
            (Self.jws(header: #"{"alg":"ES256"}"#, payload: "{}"), "signedTransaction's x5c is not leaf, intermediate and root"),
            (
                Self.jws(header: es256, payload: #"{"bundleId":"com.example.app","bundleId":"com.evil.app"}"#),
                "signedTransaction's payload is not one I-JSON text (a repeated member name, or not JSON)"
            ),
            (
                Self.jws(header: es256, payload: "not json"),
                "signedTransaction's payload is not one I-JSON text (a repeated member name, or not JSON)"
            ),
        ]
        for (jws, expected) in cases {
            #expect(await Self.reason { _ = try await data.transaction(jws) } == expected, "\(jws)")
        }
    }

    @Test("a well-formed JWS whose chain is not Apple's is refused with the caller's sentence, the details only in the reason")
    func notVerified() async throws {
        let data = try Self.signedData()
        let jws = Self.jws(header: #"{"alg":"ES256","x5c":["AAAA","AAAA","AAAA"]}"#, payload: #"{"bundleId":"com.example.app"}"#)
        do {
            _ = try await data.transaction(jws)
            Issue.record("a chain of garbage verified")
        } catch let refusal as AppleSignedData.Refusal {
            #expect(
                refusal.message
                    == "signedTransaction: its signature or its certificate chain does not verify to apple.rootCertificates at its signedDate"
            )
            #expect(refusal.reason.hasPrefix("signedTransaction: "))
        }
    }
}
