import Crypto
import Foundation
import NIOCore

/// CapGate API keys: `cg_` followed by 32 random bytes in base64url. Only the SHA-256 of a key is
/// stored, with a short visible prefix so people can tell keys apart.
public enum ApiKeyGenerator {
    public static let keyPrefix = "cg_"

    /// A new key and what is stored of it.
    public static func make() -> (key: String, prefix: String, hash: ByteBuffer) {
        let key = keyPrefix + randomToken(bytes: 32)
        return (key, String(key.prefix(11)), hash(key))
    }

    /// The stored form of a key (bound as `bytea`).
    public static func hash(_ key: String) -> ByteBuffer {
        ByteBuffer(bytes: SHA256.hash(data: Data(key.utf8)))
    }

    /// `bytes` random bytes from the system CSPRNG, base64url without padding.
    public static func randomToken(bytes: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        let raw = (0..<bytes).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        return Data(raw).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// Compares two secrets in time independent of where they differ.
    public static func constantTimeEquals(_ a: String, _ b: String) -> Bool {
        let x = Array(SHA256.hash(data: Data(a.utf8)))
        let y = Array(SHA256.hash(data: Data(b.utf8)))
        var diff: UInt8 = 0
        for i in 0..<x.count { diff |= x[i] ^ y[i] }
        return diff == 0
    }
}
