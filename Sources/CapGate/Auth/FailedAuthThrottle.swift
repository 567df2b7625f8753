import Hummingbird
import Logging
import Synchronization

/// The gateway's one ``FailedAuthWindow``, shared by the operator routes (`/admin/v1/…`, the
/// console's sign-in among them) and `/metrics` (SPEC §7). Only the failure path of those
/// authentications reaches it: a success, and every proxied call, never takes its lock.
///
/// A correct credential is let through even from an address that is being throttled: SPEC §7
/// throttles failed authentications, and refusing everyone at a throttled address would let
/// any client behind the same address (a NAT, a reverse proxy) lock the operator out. Guessing
/// is stopped by the token's length (at least 32 characters), not by this.
final class FailedAuthThrottle: Sendable {
    /// Which authentication failed: the log line's words.
    enum Kind: String, Sendable {
        case `operator` = "operator authentication failed"
        case metrics = "metrics authentication failed"
    }

    private let window: Mutex<FailedAuthWindow>
    private let now: @Sendable () -> Duration

    /// `now` is the time since any fixed origin (tests pass their own clock).
    init(window: FailedAuthWindow = FailedAuthWindow(), now: @escaping @Sendable () -> Duration = FailedAuthThrottle.uptime) {
        self.window = Mutex(window)
        self.now = now
    }

    /// Time since the process first asked.
    static let uptime: @Sendable () -> Duration = {
        let origin = ContinuousClock.now
        return { ContinuousClock.now - origin }
    }()

    /// Counts one failure from `address`.
    func failure(from address: ClientAddress) -> FailedAuthWindow.Verdict {
        let now = now()
        return window.withLock { $0.failure(from: address, at: now) }
    }

    /// The addresses counted this second.
    var tracked: Int { window.withLock { $0.tracked } }

    /// Counts the failed authentication `failure` (a 401) of `request` and returns what to
    /// answer: `failure` itself, or past the limit the 429 `rate_limit_error` with
    /// `Retry-After` (SPEC §3). Logs it with the client's address and whether a credential was
    /// sent, never the credential.
    func answer(_ failure: GatewayError, _ kind: Kind, request: Request, context: GatewayContext) -> GatewayError {
        let verdict = self.failure(from: ClientAddress(context.remoteAddress))
        let sent = request.headers[.authorization] != nil || request.headers[.xAPIKey] != nil
        context.logger.warning(
            "\(kind.rawValue)",
            metadata: [
                "client": "\(context.remoteAddress?.ipAddress ?? "unknown")",
                "credential": sent ? "wrong" : "none",
                "throttled": "\(verdict != .allowed)",
            ])
        guard case .throttled(let seconds) = verdict else { return failure }
        var headers = HTTPFields()
        headers[.retryAfter] = String(seconds)
        return GatewayError(
            .tooManyRequests, "rate_limit_error",
            "Too many failed authentications from this address: try again in \(seconds) second\(seconds == 1 ? "" : "s").",
            headers: headers)
    }
}
