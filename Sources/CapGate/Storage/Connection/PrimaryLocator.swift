import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// Finds which host of a multi-host ``DatabaseURL`` accepts writes, as libpq's
/// `target_session_attrs=read-write` does: a new connection to each host (all at once), asked
/// `pg_is_in_recovery()` and `transaction_read_only`. A host that does not answer within
/// `timeout` counts as unreachable.
public struct PrimaryLocator: Sendable {
    /// What a host turned out to be.
    public enum Role: Sendable, Equatable {
        case writable
        /// A standby (in recovery) or a server that refuses writes.
        case readOnly
        case unreachable
    }

    public let url: DatabaseURL
    public let timeout: Duration
    public let logger: Logger

    public init(url: DatabaseURL, timeout: Duration = .seconds(2), logger: Logger) {
        self.url = url
        self.timeout = timeout
        self.logger = logger
    }

    /// Every host's role, in the URL's order.
    public func roles() async -> [Role] {
        await withTaskGroup(of: (Int, Role).self) { group in
            for (index, endpoint) in url.hosts.enumerated() {
                group.addTask { (index, await role(of: endpoint, id: index)) }
            }
            var roles = Array(repeating: Role.unreachable, count: url.hosts.count)
            for await (index, role) in group { roles[index] = role }
            return roles
        }
    }

    /// The index of the writable host: `preferred` when it still is (a split brain does not
    /// move the gateway), else the first in the URL's order; nil when none is.
    public func locate(preferring preferred: Int? = nil) async -> Int? {
        let roles = await roles()
        if let preferred, roles.indices.contains(preferred), roles[preferred] == .writable { return preferred }
        return roles.firstIndex(of: .writable)
    }

    /// One probe connection; its connect and its query are bounded by `timeout`.
    func role(of endpoint: DatabaseURL.Endpoint, id: Int) async -> Role {
        do {
            let configuration = try url.connectionConfiguration(for: endpoint, connectTimeout: timeout)
            let logger = self.logger
            return try await withDeadline(timeout + .milliseconds(500)) {
                let connection = try await PostgresConnection.connect(configuration: configuration, id: id, logger: logger)
                do {
                    let rows = try await connection.query(
                        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')", logger: logger)
                    var role = Role.readOnly
                    for try await (recovery, readOnly) in rows.decode((Bool, String).self) {
                        role = !recovery && readOnly == "off" ? .writable : .readOnly
                    }
                    try? await connection.close()
                    return role
                } catch {
                    try? await connection.close()
                    throw error
                }
            }
        } catch {
            logger.debug(
                "database host did not answer the failover probe",
                metadata: ["host": "\(endpoint)", "error": "\(String(reflecting: error))"])
            return .unreachable
        }
    }
}

extension DatabaseURL {
    /// This URL pointed at its writable host (itself for a single-host URL, without probing):
    /// what the one-shot commands (`migrate`, `verify`, `rollover`) connect to.
    /// - Throws: ``NoWritableHost`` when no host accepts writes for `limit`.
    public func writable(logger: Logger, within limit: Duration = .seconds(15)) async throws -> DatabaseURL {
        guard isMultiHost else { return self }
        // Asked again for a while: a failover in progress, or a host too busy to answer one probe
        // in time, is not yet "no primary".
        let deadline = ContinuousClock.now + limit
        while true {
            let roles = await PrimaryLocator(url: self, logger: logger).roles()
            if let index = roles.firstIndex(of: .writable) { return only(hosts[index]) }
            guard ContinuousClock.now + .milliseconds(500) < deadline else { throw NoWritableHost(hosts: hosts, roles: roles) }
            try await Task.sleep(for: .milliseconds(500))
        }
    }
}

/// None of a multi-host `database.url`'s hosts accepts writes (all down, or all standbys).
public struct NoWritableHost: Error, CustomStringConvertible {
    public let hosts: [DatabaseURL.Endpoint]
    public let roles: [PrimaryLocator.Role]

    public var description: String {
        let each = zip(hosts, roles).map { "\($0): \($1)" }.joined(separator: ", ")
        return "no host of database.url accepts writes (\(each)); promote a standby, then try again"
    }
}
