import Foundation
import Logging
import PostgresNIO

extension CapGateRunner {
    /// What `capgate verify` found: counters that disagree with the ledger (always a failure),
    /// and charges left unsettled past the grace time (a failure only with `--strict-unsettled`).
    public struct VerifyReport: Sendable {
        public var mismatches: [BillingStore.Mismatch]
        public var unsettled: [UnsettledCharges.CompanySummary]
        /// The grace time the unsettled charges were found with, in seconds.
        public var unsettledAfter: TimeInterval

        /// The lines `capgate verify` prints.
        public var lines: [String] {
            var out = mismatches.map(\.description)
            out.append(mismatches.isEmpty ? "ok: every counter agrees with the ledger" : "\(mismatches.count) mismatches")
            let count = unsettled.reduce(0) { $0 + $1.count }
            if count == 0 {
                out.append("ok: no charge unsettled for more than \(Int(unsettledAfter)) s")
            } else {
                out += unsettled.map(\.description)
                out.append(
                    "\(count) charges unsettled for more than \(Int(unsettledAfter)) s in \(unsettled.count) companies "
                        + "(counted in the counters; resolve with `capgate unsettled list|keep|refund`)")
            }
            return out
        }

        /// 1 on a mismatch, or on an unsettled charge when `strictUnsettled`; else 0.
        public func exitCode(strictUnsettled: Bool) -> Int32 {
            if !mismatches.isEmpty { return 1 }
            return strictUnsettled && !unsettled.isEmpty ? 1 : 0
        }
    }

    /// `capgate verify [--unsettled-after S]`: counters against the ledger, and unsettled charges.
    public static func verifyReport(
        url: DatabaseURL, unsettledAfter: TimeInterval = UnsettledCharges.defaultGrace, logger: Logger
    ) async throws -> VerifyReport {
        try await withClient(url: url, logger: logger) { client in
            let database = Database(client: client, timeout: .seconds(3600), logger: logger)
            let mismatches = try await BillingStore(database: database).verify()
            let unsettled = try await UnsettledCharges(database: database).summary(olderThan: unsettledAfter)
            return VerifyReport(mismatches: mismatches, unsettled: unsettled, unsettledAfter: unsettledAfter)
        }
    }

    /// `capgate unsettled list [--company C] [--older-than S] [--limit N]`.
    public static func unsettledList(
        url: DatabaseURL, company: UUID?, olderThan: TimeInterval = UnsettledCharges.defaultGrace, limit: Int = 1000,
        logger: Logger
    ) async throws -> [UnsettledCharges.Charge] {
        try await withUnsettledCharges(url: url, logger: logger) {
            try await $0.list(company: company, olderThan: olderThan, limit: limit)
        }
    }

    /// `capgate unsettled keep <ledger-id>...`: each charge stands, marked settled.
    public static func unsettledKeep(
        url: DatabaseURL, ids: [Int64], company: UUID? = nil, olderThan: TimeInterval = UnsettledCharges.defaultGrace,
        logger: Logger
    ) async throws -> [UnsettledCharges.Resolution] {
        try await withUnsettledCharges(url: url, logger: logger) {
            try await $0.keep(ids, company: company, olderThan: olderThan)
        }
    }

    /// `capgate unsettled refund <ledger-id>...`: each charge is given back (`capgate_refund`).
    public static func unsettledRefund(
        url: DatabaseURL, ids: [Int64], company: UUID? = nil, olderThan: TimeInterval = UnsettledCharges.defaultGrace,
        logger: Logger
    ) async throws -> [UnsettledCharges.Resolution] {
        try await withUnsettledCharges(url: url, logger: logger) {
            try await $0.refund(ids, company: company, olderThan: olderThan)
        }
    }

    /// `body` with the unsettled charges of the database at `url`, over a short-lived client
    /// (a one-shot command: no deadline of its own).
    static func withUnsettledCharges<T: Sendable>(
        url: DatabaseURL, logger: Logger, _ body: @escaping @Sendable (UnsettledCharges) async throws -> T
    ) async throws -> T {
        try await withClient(url: url, logger: logger) { client in
            try await body(UnsettledCharges(database: Database(client: client, timeout: .seconds(3600), logger: logger)))
        }
    }
}
