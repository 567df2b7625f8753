import AsyncHTTPClient
import CapGateDev
import Foundation
import NIOCore
import NIOSSL
import Synchronization
import Testing
import X509

@testable import CapGate

#if canImport(Glibc)
    import Glibc
#endif

/// HTTPS on CapGate's own listener (`http.tls.certificate`, `http.tls.key`): curl and the official
/// SDK over it with a test CA, a renewed certificate taken on SIGHUP while calls run, plain HTTP
/// sent to it, and the start refused for bad files.
@Suite("HTTPS on the listener", .timeLimit(.minutes(5)))
struct ListenerTLSTests {
    /// A folder holding the gateway's certificate and key files.
    struct PEMFiles {
        let folder = NSTemporaryDirectory() + "capgate-listener-tls-\(UUID().uuidString)"
        var certificate: String { folder + "/server.crt" }
        var key: String { folder + "/server.key" }
        var settings: [String: String] { ["http.tls.certificate": certificate, "http.tls.key": key] }

        init(_ issued: TestPKI.Issued) throws {
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try write(issued)
        }

        /// Replaces both files as a renewal tool does: each written beside its place, then renamed over it.
        func write(_ issued: TestPKI.Issued) throws {
            try issued.certificate.serializeAsPEM().pemString.write(toFile: certificate, atomically: true, encoding: .utf8)
            try issued.key.pemRepresentation.write(toFile: key, atomically: true, encoding: .utf8)
        }

        func remove() { try? FileManager.default.removeItem(atPath: folder) }
    }

    /// A `localhost` (and 127.0.0.1) certificate from the test CA, valid for `days` more days.
    static func issue(days: Double) throws -> TestPKI.Issued {
        let now = Date()
        return try TestPKI.server(
            names: ["localhost"], addresses: [[127, 0, 0, 1]], issuer: TestPKI.shared.ca, from: now - 3600, until: now + 86400 * days)
    }

    /// What an ``HTTPSSession`` reports for a certificate the test issued.
    static func served(_ issued: TestPKI.Issued) throws -> HTTPSSession.Served {
        let nio = try issued.nioCertificate
        return HTTPSSession.Served(serial: nio.serialNumber.map { String(format: "%02X", $0) }.joined(), notAfter: Int64(nio.notValidAfter))
    }

    /// The port of a harness's gateway URL.
    static func port(_ url: String) throws -> Int {
        try #require(URLComponents(string: url)?.port)
    }

    @Test("curl --cacert and the official Python SDK (httpx verify= the test CA) over HTTPS: answered 200, each call charged once")
    func curlAndSDK() async throws {
        let python = try await PythonTools.python()
        let files = try PEMFiles(TestPKI.shared.localhost)
        defer { files.remove() }
        try await Harness.with(settings: files.settings) { h in
            #expect(h.gatewayURL.hasPrefix("https://127.0.0.1:"))
            try await h.createPlan("open", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "open", users: 1)
            let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'"

            let (curled, output) = try await SDKTests.run(
                "curl",
                [
                    "-sS", "--cacert", TestPKI.shared.caFile, "-w", "\\nstatus=%{http_code} version=%{http_version}",
                    "https://localhost:\(try Self.port(h.gatewayURL))/v1/messages", "-H", "x-api-key: \(users[0].key)",
                    "-H", "anthropic-version: 2023-06-01", "-H", "content-type: application/json",
                    "-d", #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#,
                ])
            #expect(curled == 0, "\(output)")
            #expect(output.contains("Hello from the mock provider."), "\(output)")
            // curl offers h2 and http/1.1 by ALPN; the gateway takes http/1.1.
            #expect(output.hasSuffix("status=200 version=1.1"), "\(output)")
            #expect(try await h.scalar(charged) == 1)

            let (status, sdkOutput) = try await SDKTests.run(
                python, [SDKTests.root.appendingPathComponent("Tests/sdk/anthropic_sdk_tls.py").path],
                environment: ["CAPGATE_URL": h.gatewayURL, "CAPGATE_KEY": users[0].key, "CAPGATE_CA_FILE": TestPKI.shared.caFile])
            #expect(status == 0, "\(sdkOutput)")
            #expect(sdkOutput.contains("sdk tls ok"), "\(sdkOutput)")
            // The SDK's one answered call; its attempt without the CA never got past the handshake.
            #expect(try await h.scalar(charged) == 2)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
        }
    }

    @Test("TLS 1.2 is the least the listener speaks: a client offering at most TLS 1.1 is refused, 1.2 is served")
    func leastTLSVersion() async throws {
        let files = try PEMFiles(TestPKI.shared.localhost)
        defer { files.remove() }
        try await Harness.with(settings: files.settings) { h in
            let port = try Self.port(h.gatewayURL)
            await #expect(throws: (any Error).self) {
                try await HTTPSSession.with(port: port, offeringAtMost: .tlsv11) { session in try await session.send(.GET, "/healthz") }
            }
            let version = try await HTTPSSession.with(port: port, offeringAtMost: .tlsv12) { session in
                #expect(try await session.send(.GET, "/healthz").status == 200)
                return try await session.tlsVersion()
            }
            #expect(version == .tlsv12)
        }
    }

    @Test(
        "plain HTTP sent to the HTTPS port: the connection closes, nothing is charged, nothing is logged above debug; the port still serves HTTPS"
    )
    func plainHTTPToTLSPort() async throws {
        let files = try PEMFiles(TestPKI.shared.localhost)
        defer { files.remove() }
        let log = LogCapture()
        try await Harness.with(settings: files.settings, gatewayLogger: log.logger(level: .debug)) { h in
            try await h.createPlan("open", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "open", users: 1)
            let port = try Self.port(h.gatewayURL)
            let linesBefore = log.all.count
            let body = #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#
            let raw = try await RawConnection.open(port: port)
            try await raw.send(
                "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-api-key: \(users[0].key)\r\ncontent-type: application/json\r\n"
                    + "content-length: \(body.utf8.count)\r\n\r\n\(body)")
            #expect(await raw.closed(within: .seconds(5)))
            #expect(await raw.answer(within: .milliseconds(1)) == nil)
            // curl's plain request to it fails the same way (no HTTP answer).
            let (curled, output) = try await SDKTests.run(
                "curl",
                [
                    "-sS", "-m", "10", "http://127.0.0.1:\(port)/v1/messages", "-H", "x-api-key: \(users[0].key)",
                    "-H", "content-type: application/json", "-d", body,
                ])
            #expect(curled != 0, "\(output)")
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'") == 0)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 0)

            // Nothing at warning or above, and nothing about TLS above debug.
            let lines = Array(log.all.dropFirst(linesBefore))
            let loud = lines.filter { line in
                ["warning ", "error ", "critical "].contains { line.hasPrefix($0) }
                    || (!line.hasPrefix("debug ") && !line.hasPrefix("trace ") && (line.contains("TLS") || line.contains("SSL")))
            }
            #expect(loud.isEmpty, "\(loud)")
            #expect(lines.filter { $0.hasPrefix("debug TLS handshake failed") }.count == 2, "\(lines)")
            // The same port still serves HTTPS, and charges that call.
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'") == 1)
        }
    }
}

/// The files as `openssl` writes them, which swift-certificates and NIOSSL must both read.
@Suite("HTTPS on the listener: files as openssl writes them", .timeLimit(.minutes(1)))
struct ListenerTLSOpenSSLFilesTests {
    @Test("an RSA key (PKCS#8 and PKCS#1) and a P-256 key with its EC PARAMETERS load; each is refused under the other's certificate")
    func opensslFiles() async throws {
        let folder = NSTemporaryDirectory() + "capgate-openssl-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let subject = ["-days", "30", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
        func path(_ name: String) -> String { folder + "/" + name }
        for arguments in [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", path("rsa.key"), "-out", path("rsa.crt")] + subject,
            ["rsa", "-in", path("rsa.key"), "-traditional", "-out", path("rsa1.key")],
            ["ecparam", "-name", "prime256v1", "-genkey", "-out", path("ec.key")],
            ["req", "-x509", "-key", path("ec.key"), "-out", path("ec.crt")] + subject,
        ] {
            let (status, output) = try await SDKTests.run("openssl", arguments)
            try #require(status == 0, "openssl \(arguments): \(output)")
        }
        let heads = try ["rsa.key", "rsa1.key", "ec.key"].map { try String(contentsOfFile: path($0), encoding: .utf8).prefix(40) }
        #expect(heads[0].hasPrefix("-----BEGIN PRIVATE KEY-----"))
        #expect(heads[1].hasPrefix("-----BEGIN RSA PRIVATE KEY-----"))
        #expect(heads[2].hasPrefix("-----BEGIN EC PARAMETERS-----"))
        for (certificate, key) in [("rsa.crt", "rsa.key"), ("rsa.crt", "rsa1.key"), ("ec.crt", "ec.key")] {
            #expect(throws: Never.self) { _ = try ListenerTLS(files: ListenerTLSFiles(certificate: path(certificate), key: path(key))) }
        }
        for (certificate, key) in [("rsa.crt", "ec.key"), ("ec.crt", "rsa1.key")] {
            #expect(throws: ConfigurationError.self) {
                _ = try ListenerTLS(files: ListenerTLSFiles(certificate: path(certificate), key: path(key)))
            }
        }
    }
}
