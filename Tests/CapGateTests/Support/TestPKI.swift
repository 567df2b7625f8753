import Crypto
import Foundation
import NIOSSL
import SwiftASN1
import X509

/// Certificates made for a test run with swift-certificates and P-256 keys: a CA the gateway is
/// told to trust (its PEM in ``caFile``), another CA it does not know, and server certificates
/// for `localhost`, for the wrong name, expired, and from the other CA.
struct TestPKI: Sendable {
    /// A certificate with its key, ready for a NIOSSL server.
    struct Issued: Sendable {
        var certificate: Certificate
        var key: P256.Signing.PrivateKey

        var nioCertificate: NIOSSLCertificate {
            get throws { try NIOSSLCertificate(bytes: Array(certificate.serializeAsPEM().pemString.utf8), format: .pem) }
        }
        var nioKey: NIOSSLPrivateKey {
            get throws { try NIOSSLPrivateKey(bytes: Array(key.pemRepresentation.utf8), format: .pem) }
        }
    }

    let ca: Issued
    let otherCA: Issued
    /// For `localhost` and the address 127.0.0.1, from ``ca``.
    let localhost: Issued
    /// For `wrong.example` only, from ``ca``.
    let wrongName: Issued
    /// For `localhost`, from ``ca``, ended yesterday.
    let expired: Issued
    /// For `localhost`, from ``otherCA``.
    let unknownIssuer: Issued
    /// A PEM file holding ``ca``'s certificate (what `upstream.caFile` names).
    let caFile: String

    /// Made once per test process (key generation and signing are quick, but need not repeat).
    static let shared: TestPKI = try! TestPKI()

    private init() throws {
        let now = Date()
        ca = try Self.authority("CapGate Test CA", now: now)
        otherCA = try Self.authority("Some Other CA", now: now)
        localhost = try Self.server(
            names: ["localhost"], addresses: [[127, 0, 0, 1]], issuer: ca, from: now - 3600, until: now + 86400 * 30)
        wrongName = try Self.server(names: ["wrong.example"], issuer: ca, from: now - 3600, until: now + 86400 * 30)
        expired = try Self.server(names: ["localhost"], issuer: ca, from: now - 86400 * 30, until: now - 86400)
        unknownIssuer = try Self.server(names: ["localhost"], issuer: otherCA, from: now - 3600, until: now + 86400 * 30)
        caFile = NSTemporaryDirectory() + "capgate-test-ca-\(UUID().uuidString).pem"
        try ca.certificate.serializeAsPEM().pemString.write(toFile: caFile, atomically: true, encoding: .utf8)
    }

    /// A self-signed CA (basicConstraints CA, keyCertSign).
    static func authority(_ name: String, now: Date) throws -> Issued {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName { CommonName(name) }
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: now - 86400, notValidAfter: now + 86400 * 365, issuer: subject, subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                KeyUsage(keyCertSign: true, cRLSign: true)
            },
            issuerPrivateKey: .init(key))
        return Issued(certificate: certificate, key: key)
    }

    /// A server certificate for `names` and `addresses` (subjectAltName dNSName and iPAddress),
    /// signed by `issuer`.
    static func server(names: [String], addresses: [[UInt8]] = [], issuer: Issued, from: Date, until: Date) throws -> Issued {
        let key = P256.Signing.PrivateKey()
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: from, notValidAfter: until, issuer: issuer.certificate.subject,
            subject: try DistinguishedName { CommonName(names[0]) },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                KeyUsage(digitalSignature: true)
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(
                    names.map { .dnsName($0) } + addresses.map { .ipAddress(ASN1OctetString(contentBytes: $0[...])) })
            },
            issuerPrivateKey: .init(issuer.key))
        return Issued(certificate: certificate, key: key)
    }
}
