import PostgresNIO

extension Database {
    /// Whether the database calls go to now accepts writes: its host answers within
    /// `database.timeout`, is not in recovery (a standby) and is not read-only (the same test as
    /// ``PrimaryLocator``'s). A failure counts as no; a multi-host URL's follower hears of it and
    /// looks for the writable host, as after any failed call.
    func acceptsWrites() async -> Bool {
        let logger = self.logger
        do {
            return try await run { client in
                let rows = try await client.query(
                    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'", logger: logger)
                return try await rows.decode(Bool.self).collect().first ?? false
            }
        } catch {
            logger.debug("the writable check failed", metadata: ["error": "\(String(reflecting: error))"])
            return false
        }
    }
}
