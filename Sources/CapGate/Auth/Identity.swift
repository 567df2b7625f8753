import Foundation

/// Who is calling, as established from a verified credential (never from a client header).
public enum Identity: Sendable, Equatable {
    /// A user of one company.
    case user(UserIdentity)
    /// The operator, by the name of the token it presented (`operator` for the unnamed
    /// `operator.token`, else its `operator.tokens` name): the audit log names it.
    case `operator`(name: String)

    /// The operator, whichever token.
    public var isOperator: Bool {
        if case .operator = self { return true }
        return false
    }

    public var user: UserIdentity? {
        if case .user(let u) = self { return u }
        return nil
    }
}

/// A verified user of a company.
public struct UserIdentity: Sendable, Equatable {
    public enum Role: String, Sendable { case member, admin }
    /// How the caller proved who they are.
    public enum Credential: String, Sendable { case apiKey = "api_key", jwt }

    public var companyID: UUID
    public var userID: UUID
    public var role: Role
    public var credential: Credential
    /// The features a bound credential may be charged to (a JWT's `jwt.featureClaim`, an API
    /// key's `features` as it was when this request authenticated); nil: unbound. A metered call
    /// by API key reads the key's binding again inside its admission (SPEC §8).
    public var features: [String]?

    public init(companyID: UUID, userID: UUID, role: Role, credential: Credential, features: [String]? = nil) {
        self.companyID = companyID
        self.userID = userID
        self.role = role
        self.credential = credential
        self.features = features
    }
}
