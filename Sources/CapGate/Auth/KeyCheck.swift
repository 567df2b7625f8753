/// Whether an API key may be used now, as `capgate_key_check` (the rule's one place) answered it in
/// the admission transaction or the key check before a body is read, whichever asked first;
/// anything but ``ok`` is a 401 (``Authenticator/keyError(_:)``).
public enum KeyCheck: String, Sendable, CaseIterable {
    case ok
    case unknownKey = "unknown_key"
    case revokedKey = "revoked_key"
    case expiredKey = "expired_key"
    /// The key's user is disabled in its company.
    case disabledUser = "disabled_user"
}
