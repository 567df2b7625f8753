import CapGate
import Foundation
import Testing

/// The credential is verified before a byte of the body is read: a caller who is not one gets
/// its 401 while it is still sending, and the gateway buffers nothing for it.
@Suite("Credentials before the body", .serialized, .timeLimit(.minutes(10)))
struct CredentialsFirstTests {
    static func head(_ credential: String, length: Int) -> String {
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n\(credential)\r\ncontent-type: application/json\r\n"
            + "content-length: \(length)\r\n\r\n"
    }

    @Test("an unknown key, a revoked key and a bad token declaring a 30 MB body are answered 401 before the body is sent")
    func refusedBeforeBody() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 2)
            let port = Int(h.gatewayURL.split(separator: ":").last!)!
            let keys = try await h.op(.GET, "/admin/v1/companies/\(company.text)/api-keys")
            let revokedID = keys.json["data"]?.arrayValue?.first { $0["user_id"]?.stringValue == users[1].id.text }?["id"]?.stringValue
            let revoke = try await h.op(.DELETE, "/admin/v1/companies/\(company.text)/api-keys/\(revokedID ?? "")")
            #expect(revoke.status == 200 || revoke.status == 204)

            for credential in [
                "x-api-key: cg_unknown_\(UUID().uuidString)", "x-api-key: \(users[1].key)",
                "authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",
            ] {
                let connection = try await RawConnection.open(port: port)
                defer { connection.close() }
                try await connection.send(Self.head(credential, length: 30_000_000))
                // Not one byte of the body was sent: the answer comes anyway.
                let answer = await connection.answer(within: .seconds(10))
                #expect(answer?.status == 401, "\(credential.prefix(12)): \(answer?.head ?? "no answer")")
                #expect(answer?.body.contains("authentication_error") == true)
            }
            // A valid key declaring a body over the limit is 413 before the body, also unread.
            let connection = try await RawConnection.open(port: port)
            defer { connection.close() }
            try await connection.send(Self.head("x-api-key: \(users[0].key)", length: 300_000_000))
            #expect(await connection.answer(within: .seconds(10))?.status == 413)
            #expect(h.mock.counter.count == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
        }
    }
}
