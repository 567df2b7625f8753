import CapGate
import Foundation
import Testing

/// SPEC §7 through the real server: failed operator authentications (the operator routes, the
/// console's sign-in `GET /admin/v1/me`) and failed `/metrics` authentications are throttled
/// per client address, past 10 in a second: 429 `rate_limit_error` with `Retry-After`. A correct
/// credential is never throttled, even from a throttled address; another address is not
/// affected; every failure is logged, never with the token. The second client address is
/// 127.0.0.2 (any of 127.0.0.0/8 reaches the loopback).
@Suite("Failed operator and metrics authentications", .timeLimit(.minutes(5)))
struct AuthThrottleTests {
    /// One GET from `source`, on a connection of its own.
    static func get(
        port: Int, _ path: String, headers: [String] = [], from source: String = "127.0.0.1"
    ) async throws
        -> RawConnection.Answer?
    {
        let connection = try await RawConnection.open(port: port, from: source)
        defer { connection.close() }
        let head = (["GET \(path) HTTP/1.1", "host: 127.0.0.1"] + headers + ["", ""]).joined(separator: "\r\n")
        try await connection.send(head)
        return await connection.answer(within: .seconds(30))
    }

    static func bearer(_ token: String) -> [String] { ["authorization: Bearer \(token)"] }

    /// 30 failed authentications from 127.0.0.1 at once (each with a wrong token of its own,
    /// kept in `sent`), until one is refused 429; the statuses.
    static func flood(port: Int, paths: [String], sent: inout [String]) async throws -> [Int] {
        var statuses: [Int] = []
        for _ in 0..<5 where !statuses.contains(429) {
            let tokens = (0..<30).map { _ in "wrong-" + UUID().uuidString + UUID().uuidString }
            sent += tokens
            statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for (i, token) in tokens.enumerated() {
                    // Some with no credential at all: those fail too.
                    let headers = i % 10 == 9 ? [] : Self.bearer(token)
                    group.addTask { try await Self.get(port: port, paths[i % paths.count], headers: headers)?.status ?? 0 }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
        }
        return statuses
    }

    /// The 429's answer: the SPEC §3 envelope with `rate_limit_error` and a `Retry-After`.
    static func expectThrottled(_ answer: RawConnection.Answer?) throws {
        let answer = try #require(answer)
        #expect(answer.status == 429, "\(answer.head)")
        #expect(answer.head.lowercased().contains("\r\nretry-after: 1"), "\(answer.head)")
        #expect(answer.head.lowercased().contains("\r\nrequest-id: req_"), "\(answer.head)")
        let json = try JSON.parse(Array(answer.body.utf8))
        #expect(json["type"]?.stringValue == "error")
        #expect(json["error"]?["type"]?.stringValue == "rate_limit_error", "\(answer.body)")
        #expect(json["error"]?["message"]?.stringValue?.isEmpty == false)
    }

    @Test(
        "operator routes and the console sign-in: past 10 wrong tokens in a second, 429 rate_limit_error with Retry-After; the right token still passes; another address is unaffected; no token logged"
    )
    func operatorRoutes() async throws {
        // Its checks must fall in one clock second: not beside the heavy tests.
        try await HeavyTests.alone { try await Self.operatorRoutesAlone() }
    }

    static func operatorRoutesAlone() async throws {
        let log = LogCapture()
        try await Harness.with(gatewayLogger: log.logger(level: .info)) { h in
            let port = Int(h.gatewayURL.split(separator: ":").last!)!
            var sent: [String] = []
            var proved = false
            // The window is one clock second: the checks after the flood count only when a
            // last wrong token from the flooding address is still refused, which proves they
            // fell in the same second. Tried again from a fresh second otherwise.
            for _ in 0..<20 where !proved {
                try await Task.sleep(for: .milliseconds(1_100))
                let statuses = try await Self.flood(port: port, paths: ["/admin/v1/companies", "/admin/v1/me"], sent: &sent)
                #expect(Set(statuses).isSubset(of: [401, 429]), "\(statuses)")
                try #require(statuses.contains(429), "\(statuses)")
                #expect(statuses.filter { $0 == 401 }.count >= 10, "\(statuses)")

                let right = try await Self.get(port: port, "/admin/v1/me", headers: Self.bearer(h.operatorToken))
                let rightList = try await Self.get(port: port, "/admin/v1/companies", headers: Self.bearer(h.operatorToken))
                let otherWrong = try await Self.get(
                    port: port, "/admin/v1/companies", headers: Self.bearer("wrong-other"), from: "127.0.0.2")
                let otherRight = try await Self.get(port: port, "/admin/v1/me", headers: Self.bearer(h.operatorToken), from: "127.0.0.2")
                let stillRefused = try await Self.get(port: port, "/admin/v1/me", headers: Self.bearer("wrong-last"))
                sent += ["wrong-other", "wrong-last"]
                guard stillRefused?.status == 429 else { continue }
                proved = true
                try Self.expectThrottled(stillRefused)
                #expect(right?.status == 200 && right?.body.contains(#""role":"operator""#) == true, "\(right?.body ?? "")")
                #expect(rightList?.status == 200)
                #expect(otherWrong?.status == 401 && otherWrong?.body.contains("authentication_error") == true)
                #expect(otherRight?.status == 200)
            }
            #expect(proved, "no flood and its checks fell within one second in twenty tries")

            // A new second: the flooding address has its 10 again.
            try await Task.sleep(for: .milliseconds(1_100))
            #expect(try await Self.get(port: port, "/admin/v1/plans", headers: Self.bearer("wrong-later"))?.status == 401)
            sent.append("wrong-later")

            // Every failure is logged with its client, and which were throttled; no token anywhere.
            let failures = log.matching("operator authentication failed")
            #expect(failures.count == sent.count, "\(failures.count) lines for \(sent.count) failures")
            #expect(failures.filter { $0.contains("client=127.0.0.2") }.count == sent.filter { $0 == "wrong-other" }.count)
            #expect(failures.contains { $0.contains("throttled=true") } && failures.contains { $0.contains("throttled=false") })
            #expect(failures.allSatisfy { $0.hasPrefix("warning") && $0.contains("request_id=req_") })
            let everything = log.all.joined(separator: "\n")
            #expect(!everything.contains(h.operatorToken))
            #expect(!sent.contains { everything.contains($0) })
        }
    }

    @Test(
        "/metrics: past 10 wrong tokens in a second, 429 with Retry-After; the operator token and metrics.token still read it; a user's key is 403, not a failure"
    )
    func metrics() async throws {
        // Its checks must fall in one clock second: not beside the heavy tests.
        try await HeavyTests.alone { try await Self.metricsAlone() }
    }

    static func metricsAlone() async throws {
        let log = LogCapture()
        let metricsToken = "metrics-reader-" + UUID().uuidString
        try await Harness.with(settings: ["metrics.token": metricsToken], gatewayLogger: log.logger(level: .info)) { h in
            let port = Int(h.gatewayURL.split(separator: ":").last!)!
            try await h.createPlan("p", company: nil, user: nil)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            // A valid credential that may not read /metrics: 403, and not counted as a failure.
            for _ in 0..<12 {
                #expect(try await Self.get(port: port, "/metrics", headers: ["x-api-key: \(users[0].key)"])?.status == 403)
            }
            #expect(log.matching("metrics authentication failed").isEmpty)

            var sent: [String] = []
            var proved = false
            for _ in 0..<20 where !proved {
                try await Task.sleep(for: .milliseconds(1_100))
                let statuses = try await Self.flood(port: port, paths: ["/metrics"], sent: &sent)
                #expect(Set(statuses).isSubset(of: [401, 429]), "\(statuses)")
                try #require(statuses.contains(429), "\(statuses)")

                let byOperator = try await Self.get(port: port, "/metrics", headers: Self.bearer(h.operatorToken))
                let byReader = try await Self.get(port: port, "/metrics", headers: Self.bearer(metricsToken))
                let otherWrong = try await Self.get(port: port, "/metrics", headers: Self.bearer("wrong-other"), from: "127.0.0.2")
                let stillRefused = try await Self.get(port: port, "/metrics", headers: Self.bearer("wrong-last"))
                sent += ["wrong-other", "wrong-last"]
                guard stillRefused?.status == 429 else { continue }
                proved = true
                try Self.expectThrottled(stillRefused)
                #expect(byOperator?.status == 200 && byOperator?.body.contains("capgate_") == true)
                #expect(byReader?.status == 200)
                #expect(otherWrong?.status == 401)
            }
            #expect(proved, "no flood and its checks fell within one second in twenty tries")

            let failures = log.matching("metrics authentication failed")
            #expect(failures.count == sent.count, "\(failures.count) lines for \(sent.count) failures")
            let everything = log.all.joined(separator: "\n")
            #expect(!everything.contains(h.operatorToken) && !everything.contains(metricsToken) && !everything.contains(users[0].key))
            #expect(!sent.contains { everything.contains($0) })
        }
    }
}
