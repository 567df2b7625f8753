import PostgresNIO

extension Database {
    /// Runs `body` on one connection inside one read-only transaction at REPEATABLE READ: every
    /// query in it sees the same snapshot, so totals and their parts read together agree (a
    /// read at READ COMMITTED, or spread over pooled connections, can see a commit between two
    /// queries). Failures are mapped as ``run(lateResult:_:)`` maps them.
    public func snapshot<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        let logger = self.logger
        return try await run { client in
            try await client.withConnection { connection in
                try await connection.query("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", logger: logger)
                let value: T
                do {
                    value = try await body(connection)
                } catch {
                    // Nothing was written: a failed ROLLBACK (a connection already gone) changes nothing.
                    _ = try? await connection.query("ROLLBACK", logger: logger)
                    throw error
                }
                try await connection.query("COMMIT", logger: logger)
                return value
            }
        }
    }
}
