import Crypto
import Foundation

/// Standard Webhooks signing (https://www.standardwebhooks.com): the receiver recomputes
/// `v1,<base64 HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>` and compares.
///
/// The key is the secret's bytes; a secret written as Standard Webhooks libraries make them,
/// `whsec_<base64>`, is the base64-decoded part after the prefix (so their verifiers accept our
/// signatures unchanged).
public enum WebhookSignature {
    public static func key(secret: String) -> SymmetricKey {
        if secret.hasPrefix("whsec_"), let bytes = Data(base64Encoded: String(secret.dropFirst("whsec_".count))) {
            return SymmetricKey(data: bytes)
        }
        return SymmetricKey(data: Data(secret.utf8))
    }

    /// The `webhook-signature` value for one attempt.
    public static func sign(id: String, timestamp: Int, body: some DataProtocol, secret: String) -> String {
        var message = Data("\(id).\(timestamp).".utf8)
        message.append(contentsOf: body)
        let mac = HMAC<SHA256>.authenticationCode(for: message, using: key(secret: secret))
        return "v1," + Data(mac).base64EncodedString()
    }

    /// Whether `header` (space-separated `v1,<base64>` entries) holds a valid signature.
    public static func verify(id: String, timestamp: Int, body: some DataProtocol, secret: String, header: String) -> Bool {
        let expected = Array(sign(id: id, timestamp: timestamp, body: body, secret: secret).utf8)
        return header.split(separator: " ").contains { candidate in
            let given = Array(candidate.utf8)
            guard given.count == expected.count else { return false }
            return zip(given, expected).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
        }
    }
}
