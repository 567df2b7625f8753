import Foundation
import Logging
import NIOCore
import PostgresNIO
import Testing

@testable import CapGate

/// An admission whose outcome is unknown has its give-back put in the spool at once, due at its
/// deadline: a gateway that stops during the wait leaves it to its next start (review of #46).
/// No database: the client below is never run, and nothing here reaches it.
@Suite("A give-back waits in the spool, not in memory", .timeLimit(.minutes(1)))
struct SpooledGiveBackTests {
    static func database(timeout: Duration) -> Database {
        let client = PostgresClient(
            configuration: .init(host: "127.0.0.1", port: 1, username: "nobody", password: nil, database: nil, tls: .disable))
        return Database(client: client, timeout: timeout, logger: Logger(label: "test"))
    }

    static func item(key: String?, company: UUID, requestID: String, at: Date) -> AdmissionItem {
        AdmissionItem(
            keyHash: key.map(ApiKeyGenerator.hash),
            request: AdmissionRequest(
                companyID: company, userID: UUID(), method: "POST", route: "/v1/messages", model: nil, requestID: requestID, at: at))
    }

    @Test("an unknown outcome is spooled at once with the calls' request ids, due at the deadline; before it nothing is applied")
    func spooledAtOnce() async throws {
        let folder = NSTemporaryDirectory() + "capgate-spool-giveback-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let spool = try Spool(directory: folder, database: "test", logger: Logger(label: "test"))
        let database = Self.database(timeout: .seconds(5))
        let (company, at) = (UUID(), Date(timeIntervalSince1970: 1_764_400_000))
        let items = [
            Self.item(key: "cg_key_one", company: UUID(), requestID: "req_a", at: at.addingTimeInterval(1)),
            Self.item(key: nil, company: company, requestID: "req_b", at: at),
        ]
        let late = LateAdmissions(items: items, database: database, spool: spool)
        let before = Date()
        late.interrupted(by: CommitUnacknowledged(reason: ConnectionLost()))
        // Written before interrupted returned: nothing waits in memory.
        let pending = spool.pending()
        try #require(pending.count == 1)
        guard case .giveBackWhenDue(let hashes, let companies, let ids, let since, let due) = pending[0].write else {
            Issue.record("spooled \(pending[0].write)")
            return
        }
        #expect(hashes == [Data(ApiKeyGenerator.hash("cg_key_one").readableBytesView)])
        #expect(companies == [company], "a token's company; a key's is found from its hash")
        #expect(ids == ["req_a", "req_b"])
        #expect(since == at, "from the earliest call's time")
        // Due at the deadline (5 s) plus a second, from when the statement was sent.
        #expect(due.timeIntervalSince(before) > 5.5 && due.timeIntervalSince(Date()) <= 6.01, "\(due.timeIntervalSince(before))")
        // Before it is due, applying it touches nothing (the client here would fail if asked).
        await #expect(throws: PendingWrites.NotDue.self) {
            try await PendingWrites.apply(pending[0].write, database: database, now: due.addingTimeInterval(-0.5))
        }
        // An error the server sent (rolled back) or none of the connection's: nothing spooled.
        late.interrupted(by: DatabaseError.other("23505"))
        #expect(spool.pending().count == 1)
    }

    @Test("the due time counts from when the statement was sent, not from when the failure is heard")
    func dueFromSending() throws {
        let database = Self.database(timeout: .seconds(5))
        let late = LateAdmissions(
            items: [Self.item(key: nil, company: UUID(), requestID: "req_c", at: Date())], database: database, spool: nil)
        let date = Date(timeIntervalSince1970: 1_800_000_000)
        guard case .giveBackWhenDue(_, _, _, _, let due) = late.giveBackWhenDue(now: late.sent + .seconds(4), date: date) else {
            Issue.record("not a due give-back")
            return
        }
        #expect(abs(due.timeIntervalSince(date) - 2) < 0.001)
        guard case .giveBackWhenDue(_, _, _, _, let past) = late.giveBackWhenDue(now: late.sent + .seconds(9), date: date) else {
            return
        }
        #expect(past == date, "past the deadline already: due at once")
    }
}
