import CapGate
import CapGateDev
import Foundation
import Testing

/// SPEC §14: a concurrency slot outlives a gateway that dies mid-call only until
/// `rate.leaseSeconds`; the real binary is killed with SIGKILL while its calls stream.
@Suite("Rate windows: a killed gateway's slots", .timeLimit(.minutes(3)))
struct RateLeaseTests {
    @Test("user_concurrency 2: the binary killed with two streams running; their slots refuse calls until the lease, then free")
    func slotsComeBackAfterLease() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the binary first: swift build")
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 2]))
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            let spool = SpoolTests.folder()
            defer { try? FileManager.default.removeItem(atPath: spool) }
            let port = try EmbeddedPostgres.freePort()
            let lease = 4
            let environment = [
                "DATABASE_URL": h.databaseURL.text, "UPSTREAM_URL": h.mockURL, "HTTP_PORT": String(port), "SPOOL_DIRECTORY": spool,
                "LOG_LEVEL": "warning", "OPERATOR_TOKEN": "op_lease-operator-token-for-the-tests", "RATE_LEASE_SECONDS": String(lease),
            ]
            let serve = try SpoolTests.startServe(environment)
            defer { serve.terminate(signal: SIGKILL) }
            try #require(try await SpoolTests.waitReady("http://127.0.0.1:\(port)"))
            #expect(try await h.eventually("SELECT slot_lease_seconds FROM config_versions", equals: Int64(lease)) == Int64(lease))

            // Two slow streams through the binary, then the binary killed mid-stream.
            var streams: [RawConnection] = []
            defer { for stream in streams { stream.close() } }
            for _ in 0..<2 {
                let connection = try await RawConnection.open(port: port)
                let body = RateInFlightTests.body
                try await connection.send(
                    "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: \(key)\r\ncontent-type: application/json\r\n"
                        + "x-mock-chunk-delay-ms: 2000\r\ncontent-length: \(body.utf8.count)\r\n\r\n\(body)")
                streams.append(connection)
            }
            #expect(try await h.eventually("SELECT count(*) FROM rate_calls WHERE scopes & 4 <> 0", equals: 2) == 2)
            let admitted = Date()
            serve.terminate(signal: SIGKILL)
            await serve.wait()

            // The slots stand for the dead gateway's calls: another gateway refuses a third call.
            let refused = try await h.message(key: key)
            #expect(refused.status == 429)
            #expect(refused.json["usage"]?["rate"]?["window"]?.stringValue == "user-concurrency")
            // ...until the lease ends; then the next admission removes them and the call goes through.
            var status = refused.status
            while status == 429 && Date().timeIntervalSince(admitted) < Double(lease) + 10 {
                try await Task.sleep(for: .milliseconds(250))
                status = try await h.message(key: key).status
            }
            let waited = Date().timeIntervalSince(admitted)
            #expect(status == 200)
            #expect(waited >= Double(lease) - 1 && waited < Double(lease) + 5, "freed after \(waited) s")
            // The dead gateway's rows stay, no longer counting, for the hourly purge; the new call's
            // goes within milliseconds of its end (with the harness gateway's next admission, or by
            // itself).
            #expect(try await h.eventually("SELECT count(*) FROM rate_calls WHERE lease_until > now()", equals: 0) == 0)
            #expect(try await h.scalar("SELECT count(*) FROM rate_calls") == 2)
        }
    }
}
