import Foundation

extension UsageStore {
    /// The company's top-up grants (SPEC §12), earliest expiry first.
    public func grants(company: UUID) async throws -> [TopUpGrant] {
        try await database.snapshot { connection in
            try await TopUpGrant.all(of: company, on: connection, logger: logger)
        }
    }
}
