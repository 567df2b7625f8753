import Foundation
import Hummingbird

/// Authenticates a request and stores the identity in the context; routes behind it use
/// ``AuthenticatedContext``, which cannot be created without that identity.
struct AuthMiddleware: RouterMiddleware {
    typealias Context = GatewayContext
    let authenticator: Authenticator
    /// Where the operator routes count failed authentications (SPEC §7); nil for the client
    /// routes, whose failures are not throttled.
    var failures: FailedAuthThrottle? = nil

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var context = context
        let identity: Identity
        do {
            identity = try await authenticator.authenticate(request.headers)
        } catch let error as GatewayError where error.status == .unauthorized {
            throw failures?.answer(error, .operator, request: request, context: context) ?? error
        }
        context.identity = identity
        if let user = identity.user {
            context.record.update {
                $0.companyID = user.companyID
                $0.userID = user.userID
            }
        }
        return try await next(request, context)
    }
}

extension AuthenticatedContext {
    /// Only the operator may pass.
    func requireOperator() throws {
        guard identity.isOperator else {
            throw GatewayError.permission("Only the operator may do this.")
        }
    }

    /// The operator, or an admin of `company`. Anyone else gets the same 403 whether or not the
    /// company exists, so the answer reveals nothing about other companies.
    func requireAdmin(of company: UUID) throws {
        switch identity {
        case .operator:
            return
        case .user(let user):
            guard user.role == .admin, user.companyID == company else {
                throw GatewayError.permission("You may only read your own company's data, as one of its admins.")
            }
        }
    }

    /// The company admin (`user_id`) or operator (token name) changing something, and the
    /// request: what the audit row names (SPEC §13).
    var auditActor: AuditActor {
        let name: String
        switch identity {
        case .operator(let tokenName): name = tokenName
        case .user(let user): name = user.userID.lowercased
        }
        return AuditActor(name: name, requestID: record.snapshot.requestID)
    }

    /// A client credential (a user of a company).
    func requireUser() throws -> UserIdentity {
        guard let user = identity.user else {
            throw GatewayError.permission("This route answers for a user's credential; the operator token has no usage of its own.")
        }
        return user
    }
}

/// A JSON response.
func jsonResponse(_ json: JSON, status: HTTPResponse.Status = .ok, headers: HTTPFields = [:]) -> Response {
    var headers = headers
    headers[.contentType] = "application/json"
    return Response(status: status, headers: headers, body: .init(byteBuffer: json.byteBuffer()))
}

/// A list in the Anthropic style: `{"data": [...], "has_more": …}`.
func listJSON(_ items: [JSON], hasMore: Bool = false, nextCursor: String? = nil) -> JSON {
    .obj(["data": .array(items), "has_more": .bool(hasMore), "next_cursor": JSON(nextCursor)])
}
