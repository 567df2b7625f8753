import Crypto
import Foundation
import SwiftASN1
import X509

/// A test App Store: a root, an intermediate and a leaf made here with swift-certificates and
/// P-256 keys (Apple's OIDs on the intermediate and the leaf, as Apple's own carry them), and
/// compact JWS signed ES256 with their `x5c`, as Apple signs notifications and transactions.
/// Variants: another root, a leaf that expired before the payload's signedDate, a leaf or an
/// intermediate without Apple's OID.
struct AppleTestSigner: Sendable {
    struct Chain: Sendable {
        var leaf: Certificate
        var leafKey: P256.Signing.PrivateKey
        var intermediate: Certificate
        var root: Certificate
    }

    static let leafOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 11, 1]
    static let intermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 1]

    let good: Chain
    let otherRoot: Chain
    let expiredLeaf: Chain
    let leafWithoutOID: Chain
    let intermediateWithoutOID: Chain
    /// The good chain's root as a PEM file (what `apple.rootCertificates` names in the tests).
    let rootFile: String
    /// Every chain was valid from two days ago; the expired leaf ended a day ago.
    static let shared: AppleTestSigner = try! AppleTestSigner()

    private init() throws {
        let now = Date()
        let rootKey = P256.Signing.PrivateKey()
        let root = try Self.root("CapGate Test Apple Root", key: rootKey, now: now)
        let interKey = P256.Signing.PrivateKey()
        let intermediate = try Self.intermediate(key: interKey, root: root, rootKey: rootKey, now: now, oid: true)
        func leaf(
            oid: Bool = true, until: Date = now + 86400 * 365, issuer: Certificate, issuerKey: P256.Signing.PrivateKey
        ) throws
            -> (Certificate, P256.Signing.PrivateKey)
        {
            let key = P256.Signing.PrivateKey()
            let certificate = try Certificate(
                version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey), notValidBefore: now - 86400 * 2,
                notValidAfter: until, issuer: issuer.subject,
                subject: try DistinguishedName { CommonName("Test Mac App Store and iTunes Store Receipt Signing") },
                signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions {
                    Critical(BasicConstraints.notCertificateAuthority)
                    Critical(KeyUsage(digitalSignature: true))
                    SubjectKeyIdentifier(hash: .init(key.publicKey))
                    AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: issuer.publicKey).keyIdentifier)
                    if oid { Certificate.Extension(oid: Self.leafOID, critical: false, value: [0x05, 0x00]) }
                },
                issuerPrivateKey: .init(issuerKey))
            return (certificate, key)
        }
        let (goodLeaf, goodKey) = try leaf(issuer: intermediate, issuerKey: interKey)
        good = Chain(leaf: goodLeaf, leafKey: goodKey, intermediate: intermediate, root: root)
        let (expired, expiredKey) = try leaf(until: now - 86400, issuer: intermediate, issuerKey: interKey)
        expiredLeaf = Chain(leaf: expired, leafKey: expiredKey, intermediate: intermediate, root: root)
        let (bare, bareKey) = try leaf(oid: false, issuer: intermediate, issuerKey: interKey)
        leafWithoutOID = Chain(leaf: bare, leafKey: bareKey, intermediate: intermediate, root: root)
        let plainKey = P256.Signing.PrivateKey()
        let plain = try Self.intermediate(key: plainKey, root: root, rootKey: rootKey, now: now, oid: false)
        let (underPlain, underPlainKey) = try leaf(issuer: plain, issuerKey: plainKey)
        intermediateWithoutOID = Chain(leaf: underPlain, leafKey: underPlainKey, intermediate: plain, root: root)
        let otherKey = P256.Signing.PrivateKey()
        let other = try Self.root("CapGate Test Apple Root", key: otherKey, now: now)
        let otherInterKey = P256.Signing.PrivateKey()
        let otherInter = try Self.intermediate(key: otherInterKey, root: other, rootKey: otherKey, now: now, oid: true)
        let (otherLeaf, otherLeafKey) = try leaf(issuer: otherInter, issuerKey: otherInterKey)
        otherRoot = Chain(leaf: otherLeaf, leafKey: otherLeafKey, intermediate: otherInter, root: other)
        rootFile = NSTemporaryDirectory() + "capgate-test-apple-root-\(UUID().uuidString).pem"
        try root.serializeAsPEM().pemString.write(toFile: rootFile, atomically: true, encoding: .utf8)
    }

    static func root(_ name: String, key: P256.Signing.PrivateKey, now: Date) throws -> Certificate {
        let subject = try DistinguishedName { CommonName(name) }
        return try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey), notValidBefore: now - 86400 * 2,
            notValidAfter: now + 86400 * 3650, issuer: subject, subject: subject, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: .init(key.publicKey))
            },
            issuerPrivateKey: .init(key))
    }

    static func intermediate(
        key: P256.Signing.PrivateKey, root: Certificate, rootKey: P256.Signing.PrivateKey, now: Date, oid: Bool
    )
        throws -> Certificate
    {
        try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey), notValidBefore: now - 86400 * 2,
            notValidAfter: now + 86400 * 3650, issuer: root.subject,
            subject: try DistinguishedName { CommonName("Test Apple Worldwide Developer Relations Certification Authority") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: .init(key.publicKey))
                AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: root.publicKey).keyIdentifier)
                if oid { Certificate.Extension(oid: Self.intermediateOID, critical: false, value: [0x05, 0x00]) }
            },
            issuerPrivateKey: .init(rootKey))
    }

    /// `payload` (a JSON object's text) signed ES256 by `chain`'s leaf, with its `x5c`.
    func sign(_ payload: String, chain: Chain? = nil) throws -> String {
        let chain = chain ?? good
        let x5c = try [chain.leaf, chain.intermediate, chain.root].map { certificate -> String in
            var serializer = DER.Serializer()
            try serializer.serialize(certificate)
            return Data(serializer.serializedBytes).base64EncodedString()
        }
        let header = try JSONSerialization.data(withJSONObject: ["alg": "ES256", "x5c": x5c], options: [.sortedKeys])
        let input = Self.base64URL(header) + "." + Self.base64URL(Data(payload.utf8))
        let signature = try chain.leafKey.signature(for: Data(input.utf8))
        return input + "." + Self.base64URL(signature.rawRepresentation)
    }

    /// A JSON object's text from `fields` (what the App Store signs).
    func sign(_ fields: [String: Any], chain: Chain? = nil) throws -> String {
        let data = try JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
        return try sign(String(decoding: data, as: UTF8.self), chain: chain)
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// Milliseconds since 1970, as Apple's dates are.
    static func millis(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }
}
