import Foundation
import NIOSSL
import SwiftASN1
import X509

/// `http.tls.certificate` / `HTTP_TLS_CERTIFICATE` and `http.tls.key` / `HTTP_TLS_KEY` (default
/// unset: plain HTTP): PEM files with which the gateway serves HTTPS itself on its listen port
/// (HTTP/1.1, TLS 1.2 or later). The certificate file holds the server's certificate first, then
/// any intermediates; the key file its unencrypted private key (PKCS#8, SEC1 or PKCS#1). Both or
/// neither: one without the other stops the start. Read at start and again on SIGHUP
/// (``ListenerTLS``); the key's content is never logged.
public struct ListenerTLSFiles: Sendable, Equatable {
    /// The certificate chain's PEM file.
    public var certificate: String
    /// The private key's PEM file.
    public var key: String

    public init(certificate: String, key: String) {
        self.certificate = certificate
        self.key = key
    }

    /// The two keys as read: nil when neither is set; a ``ConfigurationError`` naming the missing
    /// one when only one is (a certificate without its key cannot serve, and a key alone is
    /// surely a mistake the operator wants to hear about rather than a silent plain-HTTP start).
    static func pair(certificate: String?, key: String?) throws -> ListenerTLSFiles? {
        switch (certificate, key) {
        case (nil, nil):
            return nil
        case (let certificate?, let key?):
            return ListenerTLSFiles(certificate: certificate, key: key)
        case (_?, nil):
            throw ConfigurationError(key: "http.tls.key", problem: "is required when http.tls.certificate is set (HTTPS needs both files)")
        case (nil, _?):
            throw ConfigurationError(key: "http.tls.certificate", problem: "is required when http.tls.key is set (HTTPS needs both files)")
        }
    }
}

/// What the listener serves, read from ``ListenerTLSFiles`` and checked: the NIOSSL context a new
/// connection's handshake uses, and the certificate's facts for the logs (never the key).
struct ListenerIdentity: Sendable {
    let context: NIOSSLContext
    /// The leaf certificate's serial number in upper-case hex (as `openssl x509 -serial` prints it).
    let serial: String
    let notAfter: Date
    let subject: String

    /// Reads and checks both files. Throws a ``ConfigurationError`` naming the key whose file is
    /// missing, unreadable, not PEM, or (for `http.tls.key`) not the certificate's key: the same
    /// one-line message and exit code 2 as any bad setting, and on SIGHUP the reason the old
    /// identity is kept.
    static func load(_ files: ListenerTLSFiles) throws -> ListenerIdentity {
        let chain = try certificates(in: try text(of: files.certificate, key: "http.tls.certificate"), file: files.certificate)
        let key = try privateKey(in: try text(of: files.key, key: "http.tls.key"), file: files.key)
        // NIOSSL would refuse a mismatched pair too, but with BoringSSL's "KEY_VALUES_MISMATCH";
        // comparing the public keys says which file is wrong in the operator's words.
        guard key.parsed.publicKey == chain[0].parsed.publicKey else {
            throw ConfigurationError(
                key: "http.tls.key",
                problem:
                    "names a private key that is not the certificate's (http.tls.certificate): \(files.key) does not match \(files.certificate)"
            )
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0.nio) }, privateKey: .privateKey(key.nio))
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: configuration)
        } catch {
            throw ConfigurationError(
                key: "http.tls.certificate", problem: "names a certificate NIOSSL cannot serve (\(error)): \(files.certificate)")
        }
        let leaf = chain[0].parsed
        return ListenerIdentity(
            context: context, serial: chain[0].nio.serialNumber.map { String(format: "%02X", $0) }.joined(),
            notAfter: leaf.notValidAfter, subject: leaf.subject.description)
    }

    /// The file's text; a missing or unreadable file is named with the key that points at it.
    private static func text(of path: String, key: String) throws -> String {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ConfigurationError(key: key, problem: "names a file that does not exist: \(path)")
        }
        guard !isDirectory.boolValue, let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(
                key: key, problem: "names a file that cannot be read (a folder, or not readable by this user): \(path)")
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// Every `CERTIFICATE` block of the file, the server's own first.
    private static func certificates(in text: String, file: String) throws -> [(nio: NIOSSLCertificate, parsed: Certificate)] {
        let blocks = ((try? PEMDocument.parseMultiple(pemString: text)) ?? []).filter { $0.discriminator == "CERTIFICATE" }
        let chain = blocks.compactMap { block -> (nio: NIOSSLCertificate, parsed: Certificate)? in
            guard let nio = try? NIOSSLCertificate(bytes: block.derBytes, format: .der),
                let parsed = try? Certificate(derEncoded: block.derBytes)
            else { return nil }
            return (nio, parsed)
        }
        guard !chain.isEmpty, chain.count == blocks.count else {
            throw ConfigurationError(key: "http.tls.certificate", problem: "names a file with no readable PEM certificate: \(file)")
        }
        return chain
    }

    /// The file's first private key block (a file may also hold `EC PARAMETERS`, as
    /// `openssl ecparam -genkey` writes, or the certificate itself).
    private static func privateKey(in text: String, file: String) throws -> (nio: NIOSSLPrivateKey, parsed: Certificate.PrivateKey) {
        let kinds: Set<String> = ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]
        let block = ((try? PEMDocument.parseMultiple(pemString: text)) ?? []).first { kinds.contains($0.discriminator) }
        guard let block, let parsed = try? Certificate.PrivateKey(pemDocument: block),
            let nio = try? NIOSSLPrivateKey(bytes: Array(block.pemString.utf8), format: .pem)
        else {
            throw ConfigurationError(
                key: "http.tls.key",
                problem:
                    "names a file with no readable unencrypted PEM private key (PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY): \(file)")
        }
        return (nio, parsed)
    }
}
