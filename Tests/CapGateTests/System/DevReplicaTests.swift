import AsyncHTTPClient
import CapGate
import CapGateDev
import Foundation
import NIOCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite("capgate dev --replica, the real binary", .timeLimit(.minutes(5)))
struct DevReplicaTests {
    @Test(
        "dev --replica starts a primary and a synchronous standby, prints the failover commands, follows them without a restart, stops both on SIGINT"
    )
    func replicaFailover() async throws {
        // A primary with a standby per test: two set up at once on a cold, loaded machine once
        // kept a standby from streaming within 60 s, so they take turns with the heavy tests.
        try await HeavyTests.alone { try await Self.replicaFailoverAlone() }
    }

    static func replicaFailoverAlone() async throws {
        let dev = try DevRun(["--replica"], label: "dev-replica")
        defer { dev.end() }
        let (process, folder, base, output) = (dev.process, dev.folder, dev.base, dev.output)
        var ready = false
        for _ in 0..<120 {
            if let reply = try? await Harness.http.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)),
                reply.status == .ok, output().contains("pg_ctl promote")
            {
                ready = true
                break
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        try #require(ready, "dev --replica did not become ready:\n\(output())")
        #expect(output().contains("Replica mode"))

        let demo = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: folder + "/.capgate/demo.json"))))
        var call = HTTPClientRequest(url: base + "/v1/messages")
        call.method = .POST
        call.headers.add(name: "x-api-key", value: demo["member_key"]!.stringValue!)
        call.headers.add(name: "content-type", value: "application/json")
        call.body = .bytes(ByteBuffer(string: #"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#))
        #expect(try await Harness.http.execute(call, timeout: .seconds(10)).status == .ok)

        // The two printed commands, run as printed.
        let lines = output().split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        let killLine = try #require(lines.first { $0.hasPrefix("kill -9") })
        let promoteLine = try #require(lines.first { $0.contains("pg_ctl promote") })
        let (killed, killOutput) = try await SDKTests.run("/bin/sh", ["-c", killLine])
        #expect(killed == 0, "\(killOutput)")
        let (promoted, promoteOutput) = try await SDKTests.run("/bin/sh", ["-c", promoteLine])
        #expect(promoted == 0, "\(promoteOutput)")

        // The gateway finds the new primary within seconds; 20 s leaves room for the whole suite's
        // load beside this test (a fresh clone's run once took just over 10 s with the kill -9
        // crash suite running at the same time).
        var status: UInt = 0
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            status = (try? await Harness.http.execute(call, timeout: .seconds(10)).status.code) ?? 0
            if status == 200 { break }
            #expect(status == 503 || status == 0, "a call in the gap got \(status)")
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(status == 200, "no call succeeded within 20 s of the promotion:\n\(output())")
        #expect(output().contains("database failover"))

        // Stopped within a minute (the gateway's drain, then both servers' fast shutdown). Alone it
        // takes ~2 s; a CI run with the whole system layer beside it once passed 15 s. A stop
        // slower than 15 s prints the log's end, whose timestamps say which step waited.
        let (interrupted, interruptedAt) = (ContinuousClock.now, Date())
        process.terminate(signal: SIGINT)
        let stopped = await process.wait(timeout: .seconds(60)) != nil
        let took = ContinuousClock.now - interrupted
        if !stopped || took > .seconds(15) {
            print("dev --replica: SIGINT sent at \(interruptedAt); stopped: \(stopped), after \(took); log:\n\(output().suffix(4000))")
        }
        #expect(stopped, "dev did not stop within 60 s of SIGINT:\n\(output().suffix(4000))")
        #expect(
            !FileManager.default.fileExists(atPath: folder + "/.capgate/postgres-standby/data/postmaster.pid"),
            "the standby is still running")
    }
}
