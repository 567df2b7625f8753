import Crypto
import Foundation
import Logging
import SwiftASN1
import Synchronization
import Testing
import X509

@testable import CapGate

/// `http.tls.certificate` / `http.tls.key`: both or neither, each file checked at start with a
/// message naming the key, and a reload that keeps the served identity when the files are bad.
/// Certificates are made here (self-signed P-256): no socket, no database.
@Suite("The listener's TLS files (http.tls.*)", .timeLimit(.minutes(1)))
struct ListenerTLSFilesTests {
    /// A certificate for `localhost` and its key, as PEM text.
    struct Pair {
        var certificate: String
        var key: String
        var serial: String

        init(days: Double = 30) throws {
            let key = P256.Signing.PrivateKey()
            let name = try DistinguishedName { CommonName("localhost") }
            let serial = Certificate.SerialNumber()
            let certificate = try Certificate(
                version: .v3, serialNumber: serial, publicKey: .init(key.publicKey), notValidBefore: Date() - 3600,
                notValidAfter: Date() + 86400 * days, issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions { SubjectAlternativeNames([.dnsName("localhost")]) },
                issuerPrivateKey: .init(key))
            self.certificate = try certificate.serializeAsPEM().pemString
            self.key = key.pemRepresentation
            // As NIOSSL (and openssl x509 -serial) gives it: the integer's bytes without a sign byte.
            self.serial = serial.bytes.drop(while: { $0 == 0 }).map { String(format: "%02X", $0) }.joined()
        }
    }

    /// A folder of files for one test.
    struct Folder {
        let path = NSTemporaryDirectory() + "capgate-tls-unit-\(UUID().uuidString)"

        init() throws { try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true) }

        /// Writes `text` to `name` in the folder; returns its path.
        @discardableResult
        func write(_ name: String, _ text: String) throws -> String {
            try text.write(toFile: path + "/" + name, atomically: true, encoding: .utf8)
            return path + "/" + name
        }

        func files(_ pair: Pair) throws -> ListenerTLSFiles {
            ListenerTLSFiles(certificate: try write("server.crt", pair.certificate), key: try write("server.key", pair.key))
        }

        func remove() { try? FileManager.default.removeItem(atPath: path) }
    }

    /// The one-line message a load of `files` throws.
    static func refusal(_ files: ListenerTLSFiles) -> String? {
        do {
            _ = try ListenerTLS(files: files)
            return nil
        } catch {
            return "\(error)"
        }
    }

    @Test("both keys or neither, from flags, the environment (HTTP_TLS_CERTIFICATE, HTTP_TLS_KEY) or the file; one alone stops the start")
    func bothOrNeither() async throws {
        let none = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent.json")
        #expect(none.http.tls == nil)
        let fromEnvironment = try await CapGateConfiguration.load(
            environment: ["HTTP_TLS_CERTIFICATE": "/etc/capgate/tls.crt", "HTTP_TLS_KEY": "/etc/capgate/tls.key"], file: "/nonexistent.json"
        )
        #expect(fromEnvironment.http.tls == ListenerTLSFiles(certificate: "/etc/capgate/tls.crt", key: "/etc/capgate/tls.key"))
        let folder = try Folder()
        defer { folder.remove() }
        let file = try folder.write("capgate.json", #"{"http":{"tls":{"certificate":"/a.crt","key":"/a.key"}}}"#)
        #expect(
            try await CapGateConfiguration.load(environment: [:], file: file).http.tls
                == ListenerTLSFiles(certificate: "/a.crt", key: "/a.key"))
        #expect(CapGateConfiguration.keys.contains("http.tls.certificate") && CapGateConfiguration.keys.contains("http.tls.key"))

        for (flags, expected) in [
            (
                ["http.tls.certificate": "/a.crt"],
                "configuration error: http.tls.key (HTTP_TLS_KEY) is required when http.tls.certificate is set (HTTPS needs both files)"
            ),
            (
                ["http.tls.key": "/a.key"],
                "configuration error: http.tls.certificate (HTTP_TLS_CERTIFICATE) is required when http.tls.key is set (HTTPS needs both files)"
            ),
        ] {
            do {
                _ = try await CapGateConfiguration.load(flags: flags, environment: [:], file: "/nonexistent.json")
                Issue.record("expected a configuration error for \(flags)")
            } catch let error as ConfigurationError {
                #expect(error.description == expected)
            }
        }
    }

    @Test("a good pair loads (a key file with EC PARAMETERS first, or the key and certificate in one file, too)")
    func goodPairs() throws {
        let folder = try Folder()
        defer { folder.remove() }
        let pair = try Pair()
        let tls = try ListenerTLS(files: try folder.files(pair))
        #expect(tls.served.serial == pair.serial)
        let parameters = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
        let openSSLStyle = ListenerTLSFiles(
            certificate: try folder.write("a.crt", pair.certificate), key: try folder.write("a.key", parameters + pair.key))
        #expect(throws: Never.self) { _ = try ListenerTLS(files: openSSLStyle) }
        let combined = try folder.write("both.pem", pair.key + pair.certificate)
        #expect(throws: Never.self) { _ = try ListenerTLS(files: ListenerTLSFiles(certificate: combined, key: combined)) }
    }

    @Test(
        "refused with one line naming the key and the file: missing, a folder, not PEM, no key in the key file, an encrypted key, another certificate's key"
    )
    func refusals() throws {
        let folder = try Folder()
        defer { folder.remove() }
        let pair = try Pair()
        let other = try Pair()
        let good = try folder.files(pair)
        let otherKey = try folder.write("other.key", other.key)
        let notPEM = try folder.write("notes.txt", "hello\n")
        let encrypted = try folder.write(
            "encrypted.key",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIGjMF8GCSqGSIb3DQEFDTBSMDEGCSqGSIb3DQEFDDAk\n-----END ENCRYPTED PRIVATE KEY-----\n")
        let cases: [(ListenerTLSFiles, String)] = [
            (
                ListenerTLSFiles(certificate: folder.path + "/none.crt", key: good.key),
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) names a file that does not exist: \(folder.path)/none.crt"
            ),
            (
                ListenerTLSFiles(certificate: good.certificate, key: folder.path + "/none.key"),
                "http.tls.key (HTTP_TLS_KEY) names a file that does not exist: \(folder.path)/none.key"
            ),
            (
                ListenerTLSFiles(certificate: folder.path, key: good.key),
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) names a file that cannot be read (a folder, or not readable by this user): \(folder.path)"
            ),
            (
                ListenerTLSFiles(certificate: notPEM, key: good.key),
                "http.tls.certificate (HTTP_TLS_CERTIFICATE) names a file with no readable PEM certificate: \(notPEM)"
            ),
            (
                ListenerTLSFiles(certificate: good.certificate, key: good.certificate),
                "http.tls.key (HTTP_TLS_KEY) names a file with no readable unencrypted PEM private key (PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY): \(good.certificate)"
            ),
            (
                ListenerTLSFiles(certificate: good.certificate, key: encrypted),
                "http.tls.key (HTTP_TLS_KEY) names a file with no readable unencrypted PEM private key (PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY): \(encrypted)"
            ),
            (
                ListenerTLSFiles(certificate: good.certificate, key: otherKey),
                "http.tls.key (HTTP_TLS_KEY) names a private key that is not the certificate's (http.tls.certificate): \(otherKey) does not match \(good.certificate)"
            ),
        ]
        for (files, expected) in cases {
            let message = Self.refusal(files)
            #expect(message == "configuration error: " + expected)
            #expect(message?.contains("PRIVATE KEY-----") != true)
        }
    }

    @Test("a reload takes a renewed pair; a bad file keeps the served certificate and logs an error without the key")
    func reload() throws {
        let folder = try Folder()
        defer { folder.remove() }
        let first = try Pair()
        let files = try folder.files(first)
        let tls = try ListenerTLS(files: files)
        let log = Lines()
        let logger = Logger(label: "test") { _ in log }

        let renewed = try Pair(days: 90)
        _ = try folder.files(renewed)
        #expect(tls.reload(logger: logger))
        #expect(tls.served.serial == renewed.serial)
        #expect(tls.served.serial != first.serial)

        try folder.write("server.key", first.key)  // the old key under the renewed certificate
        #expect(!tls.reload(logger: logger))
        #expect(tls.served.serial == renewed.serial)
        try folder.write("server.key", "")  // a half-written file
        #expect(!tls.reload(logger: logger))
        #expect(tls.served.serial == renewed.serial)

        let lines = log.lines.withLock { $0 }
        #expect(lines.count == 3)
        #expect(lines[0].hasPrefix("notice TLS certificate reloaded") && lines[0].contains(renewed.serial), "\(lines)")
        #expect(lines[1].hasPrefix("error TLS certificate not reloaded; still serving the previous one"), "\(lines)")
        #expect(lines[1].contains("is not the certificate's") && lines[1].contains(renewed.serial), "\(lines)")
        for secret in (first.key + renewed.key).split(separator: "\n") where !secret.hasPrefix("-----") {
            #expect(!lines.joined().contains(secret))
        }
    }

    /// A log handler that keeps `level message metadata` lines.
    final class Lines: LogHandler, Sendable {
        let lines = Mutex<[String]>([])
        var metadata: Logger.Metadata {
            get { [:] }
            set {}
        }
        var logLevel: Logger.Level {
            get { .trace }
            set {}
        }

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { nil }
            set {}
        }

        func log(event: LogEvent) {
            let fields = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
            lines.withLock { $0.append((["\(event.level)", "\(event.message)"] + fields).joined(separator: " ")) }
        }
    }
}
