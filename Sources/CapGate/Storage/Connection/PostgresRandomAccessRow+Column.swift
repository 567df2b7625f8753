import PostgresNIO

extension PostgresRandomAccessRow {
    /// The value of the column the query names `name`, as `T` (an optional for a column that may
    /// be NULL). For the reads off the hot path: each call looks the name up in the row's table
    /// (the admission row reads by positions resolved once, ``AdmittedColumn``). A name the query
    /// does not select is a programming error: PostgresNIO stops the process.
    func column<T: PostgresDecodable>(_ name: String, as type: T.Type = T.self) throws -> T {
        try self[name].decode(T.self)
    }
}

extension RateState.Limits {
    /// The five limit columns of `plans` and `plan_features` (`company_rpm`, `company_tpm`,
    /// `user_rpm`, `user_tpm`, `user_concurrency`; NULL: none).
    init(columnsOf row: PostgresRandomAccessRow) throws {
        self.init(
            companyRPM: try row.column("company_rpm"), companyTPM: try row.column("company_tpm"), userRPM: try row.column("user_rpm"),
            userTPM: try row.column("user_tpm"), userConcurrency: try row.column("user_concurrency"))
    }
}
