import CapGateDev
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import CapGate

/// The App Store routes (SPEC §12) up to their store, through the gateway's router with the
/// in-memory credentials of ``StoreWorld``: who may post, and a body or signed payload refused
/// (400, the SPEC's envelope) before anything is stored. What the store then does with a
/// verified transaction (ownership, applying, the order of notifications) is PostgreSQL's and
/// proved by the integration layer (`AppStoreTests`, `AppStoreOwnershipTests`).
@Suite("App Store routes before their store", .timeLimit(.minutes(1)))
struct AppStoreRouteTests {
    let world = StoreWorld()

    static func post(
        _ client: some TestClientProtocol, _ uri: String, _ headers: HTTPFields, body: String
    ) async throws -> (HTTPResponse.Status, JSON?) {
        var fields = headers
        fields[.contentType] = "application/json"
        let response = try await client.execute(uri: uri, method: .post, headers: fields, body: ByteBuffer(string: body))
        return (response.status, try? JSONParser.parse(response.body))
    }

    /// A compact JWS whose header is `header` (its payload and signature are never reached).
    static func jws(header: String) -> String {
        UnitTestSupport.base64URL(Array(header.utf8)) + "." + UnitTestSupport.base64URL(Array("{}".utf8)) + ".c2ln"
    }

    @Test("a member's transaction is 400 when the body has no signedTransaction or it does not verify, saying why")
    func transactionRefused() async throws {
        try await world.app().test(.router) { client in
            let uri = "/v1/billing/apple/transactions"
            let cases = [
                ("{}", "'signedTransaction' is required."),
                (#"{"signedTransaction": 5}"#, "'signedTransaction' must be a string."),
                (#"{"signedTransaction": "abc"}"#, "The App Store transaction did not verify: signedTransaction is not a compact JWS."),
                (
                    #"{"signedTransaction": "\#(Self.jws(header: #"{"alg":"HS256"}"#))"}"#,
                    "The App Store transaction did not verify: signedTransaction is signed with HS256, not ES256."
                ),
                (
                    #"{"signedTransaction": "\#(Self.jws(header: #"{"alg":"ES256","x5c":["a"]}"#))"}"#,
                    "The App Store transaction did not verify: signedTransaction's x5c is not leaf, intermediate and root."
                ),
            ]
            for (body, message) in cases {
                let (status, json) = try await Self.post(client, uri, world.member, body: body)
                let error = StoreWorld.error(json)
                #expect(status == .badRequest && error.type == "invalid_request_error", "\(body)")
                #expect(error.message == message, "\(body)")
            }
        }
    }

    @Test("a transaction is a company's user's to post: the operator is 403, no credential 401, a revoked key 401")
    func transactionCredentials() async throws {
        try await world.app().test(.router) { client in
            let body = #"{"signedTransaction": "abc"}"#
            let uri = "/v1/billing/apple/transactions"
            let op = try await Self.post(client, uri, world.operatorToken, body: body)
            #expect(op.0 == .forbidden)
            #expect(StoreWorld.error(op.1).message == "Only a company's member or admin posts its App Store transactions.")
            #expect(try await Self.post(client, uri, [:], body: body).0 == .unauthorized)
            #expect(try await Self.post(client, uri, [.xAPIKey: world.keys.revoked], body: body).0 == .unauthorized)
        }
    }

    @Test("a notification needs no credential, but a signedPayload that does not verify is 400")
    func notificationRefused() async throws {
        try await world.app().test(.router) { client in
            let uri = "/billing/apple/notifications"
            let missing = try await Self.post(client, uri, [:], body: "{}")
            #expect(missing.0 == .badRequest && StoreWorld.error(missing.1).message == "'signedPayload' is required.")
            let bad = try await Self.post(client, uri, [:], body: #"{"signedPayload": "a.b"}"#)
            #expect(bad.0 == .badRequest)
            #expect(StoreWorld.error(bad.1).message == "The App Store notification did not verify: signedPayload is not a compact JWS.")
            let notJSON = try await Self.post(client, uri, [:], body: "signedPayload=x")
            #expect(notJSON.0 == .badRequest && StoreWorld.error(notJSON.1).type == "invalid_request_error")
        }
    }

    @Test("the unmatched list and a new purchase token are the operator's: a company's admin is 403")
    func operatorRoutes() async throws {
        try await world.app().test(.router) { client in
            let unmatched = try await StoreWorld.get(client, "/admin/v1/billing/apple/unmatched", world.admin)
            #expect(unmatched.0 == .forbidden && StoreWorld.error(unmatched.1).message == "Only the operator may do this.")
            let rotate = try await Self.post(
                client, "/admin/v1/companies/\(world.acme.lowercased)/app-account-token", world.admin, body: "")
            #expect(rotate.0 == .forbidden && StoreWorld.error(rotate.1).type == "permission_error")
            let none = try await StoreWorld.get(client, "/admin/v1/billing/apple/unmatched", [:])
            #expect(none.0 == .unauthorized)
        }
    }
}
