import Foundation
import HTTPTypes
import NIOCore

/// A metered call as read off the wire, before it is admitted: who sent it (from a verified
/// credential only), what was asked, and the one reading of its body that decides the charge.
struct Call: Sendable {
    /// How the caller proved who they are.
    enum Credential: Sendable {
        /// An API key: its user is read again inside the admission transaction.
        case apiKey(String)
        /// A verified token: company and user are its claims.
        case token(UserIdentity)
    }

    let credential: Credential
    /// The company the credential names (the body's budgets and the provider connections are
    /// shared per company).
    let company: UUID
    let method: HTTPRequest.Method
    /// The request target as sent (path and query): what the provider will read.
    let target: String
    /// The path as decoded for the ledger.
    let path: String
    let headers: HTTPFields
    /// The body as received.
    let body: ByteBuffer
    /// The one strict reading of `body` (``CallBody``).
    let reading: CallBody
    let requestID: String
    /// The `Idempotency-Key` header's key, and the fingerprint of the request it is bound to.
    let idempotencyKey: String?
    let fingerprint: ByteBuffer?

    /// The path as sent, without its query: what routes are matched against.
    var rawPath: String { Self.rawPath(target) ?? path }

    /// Whether a body goes upstream (also an empty one for the methods that carry one).
    var sendsBody: Bool { body.readableBytes > 0 || method == .post || method == .put || method == .patch }

    /// The path of a request target as it was sent, without its query.
    static func rawPath(_ target: String?) -> String? {
        guard let target else { return nil }
        return String(target.prefix { $0 != "?" && $0 != "#" })
    }

    /// Client-supplied text as the ledger stores it: at most `limit` characters, without NUL
    /// (which PostgreSQL text cannot hold).
    static func ledgerText(_ text: some StringProtocol, limit: Int) -> String {
        let clipped = text.prefix(limit)
        return clipped.contains("\u{0}") ? String(clipped.filter { $0 != "\u{0}" }) : String(clipped)
    }
}
