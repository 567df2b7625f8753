import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// Step 1 of a metered call: reads it into a ``Call``. The credential first (nothing of the body
/// is read for a caller who is not one: an API key is looked up in ``KnownKeys``, a token
/// verified), then the head (405, 415), then the body within its budgets (413, 408, 503), then
/// one Content-Type field and the one strict reading of the body (400).
struct CallReader: Sendable {
    let authenticator: Authenticator
    let knownKeys: KnownKeys
    let maxBodyBytes: Int
    /// `proxy.bodyBudgetBytes`: bounds the bytes of all request bodies being read at once.
    let bodyBudget: BodyBudget
    /// `proxy.companyShare` of the body budget, per company.
    let bodyShare: CompanyShare
    /// `proxy.maxJSONDepth`: the deepest nesting of a body CapGate reads.
    let maxJSONDepth: Int

    func read(_ request: Request, requestID: String) async throws -> Call {
        let credential: Call.Credential
        let company: UUID
        if let apiKey = authenticator.apiKey(in: request.headers) {
            company = try await knownKeys.check(apiKey)
            credential = .apiKey(apiKey)
        } else {
            guard case .user(let identity) = try await authenticator.authenticate(request.headers) else {
                throw GatewayError.permission("The operator token cannot make metered calls; use a user's CapGate API key.")
            }
            company = identity.companyID
            credential = .token(identity)
        }
        try Self.checkHead(request)
        let body = try await readBody(request, company: company)
        try Self.checkContentType(request)
        let idempotencyKey = try IdempotencyKey.key(in: request.headers)
        let reading = try CallBody.read(body, contentType: request.headers[.contentType], maxDepth: maxJSONDepth)
        let path = request.uri.path
        let target = request.head.path ?? path
        return Call(
            credential: credential, company: company, method: request.method, target: target, path: path,
            headers: request.headers, body: body, reading: reading, requestID: requestID, idempotencyKey: idempotencyKey,
            fingerprint: idempotencyKey.map { _ in
                IdempotencyKey.fingerprint(method: request.method.rawValue, target: target, body: body)
            })
    }
}
