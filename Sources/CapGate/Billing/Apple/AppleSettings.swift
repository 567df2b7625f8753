import Configuration
import Foundation
import X509

/// `apple.*`: the App Store's signed notifications and transactions (SPEC §12).
public struct AppleSettings: Sendable {
    /// `apple.bundleId` / `APPLE_BUNDLE_ID` (default unset): the app's bundle id; every signed
    /// notification and transaction must carry it. Unset: the App Store routes answer 400.
    public var bundleID: String?
    /// `apple.appAppleId` / `APPLE_APP_APPLE_ID` (default unset): the app's Apple id (App Store
    /// Connect, App Information); a Production notification must carry it.
    public var appAppleID: Int64?
    /// `apple.environments` / `APPLE_ENVIRONMENTS` (default `["Production"]`): the App Store
    /// environments accepted (`Production`, `Sandbox`, `Xcode`, `LocalTesting`); a list in the
    /// file, `Production,Sandbox` as text.
    public var environments: [String]
    /// `apple.rootCertificates` / `APPLE_ROOT_CERTIFICATES` (default: Apple Root CA - G3, shipped
    /// with CapGate): PEM files of the roots the `x5c` chain must verify to; a list in the file,
    /// comma-separated as text. Read once at start; a file without a certificate stops the start.
    public var rootCertificates: [Certificate]

    static let keys = ["apple.bundleId", "apple.appAppleId", "apple.environments", "apple.rootCertificates"]
    static let knownEnvironments: Set<String> = ["Production", "Sandbox", "Xcode", "LocalTesting"]
    /// Apple Root CA - G3, as shipped (`certificates/AppleRootCA-G3.pem`).
    static let shippedRootPath = "certificates/AppleRootCA-G3.pem"

    public init(bundleID: String?, appAppleID: Int64?, environments: [String], rootCertificates: [Certificate]) {
        self.bundleID = bundleID
        self.appAppleID = appAppleID
        self.environments = environments
        self.rootCertificates = rootCertificates
    }

    /// Reads and validates the `apple.*` keys.
    init(reader: ConfigReader) throws {
        bundleID = CapGateConfiguration.nonEmpty(reader.string(forKey: "apple.bundleId"))
        let appID = try CapGateConfiguration.int(reader, "apple.appAppleId", default: 0, range: 0...Int(Int64.max))
        appAppleID = appID > 0 ? Int64(appID) : nil
        environments = Self.list(reader, "apple.environments") ?? ["Production"]
        guard !environments.isEmpty, environments.allSatisfy(Self.knownEnvironments.contains) else {
            throw ConfigurationError(key: "apple.environments", problem: "must list some of Production, Sandbox, Xcode, LocalTesting")
        }
        if let files = Self.list(reader, "apple.rootCertificates"), !files.isEmpty {
            rootCertificates = try files.map { file in
                guard let text = try? String(contentsOfFile: file, encoding: .utf8), let certificate = try? Certificate(pemEncoded: text)
                else { throw ConfigurationError(key: "apple.rootCertificates", problem: "names \(file), which holds no PEM certificate") }
                return certificate
            }
        } else {
            rootCertificates = [try Self.shippedRoot()]
        }
    }

    /// The start warning of `apple.environments` accepting `Sandbox` beside `Production` (nil
    /// otherwise): Sandbox purchases cost testers nothing, so a production gateway that accepts
    /// them can be re-planned for free.
    var sandboxWarning: String? {
        guard environments.contains("Production"), environments.contains("Sandbox") else { return nil }
        return "apple.environments accepts Sandbox beside Production: Sandbox purchases are free to testers, "
            + "so accept Sandbox only on a staging gateway"
    }

    /// Apple Root CA - G3 as built into CapGate.
    public static func shippedRoot() throws -> Certificate {
        guard let pem = EmbeddedFiles.text(shippedRootPath) else {
            throw ConfigurationError(key: "apple.rootCertificates", problem: "has no default: \(shippedRootPath) is not in this build")
        }
        return try Certificate(pemEncoded: pem)
    }

    /// A list key: an array in the file, or `a,b` / `["a", "b"]` as text.
    static func list(_ reader: ConfigReader, _ key: String) -> [String]? {
        if let list = reader.stringArray(forKey: ConfigKey(key)) { return list }
        guard let text = reader.string(forKey: ConfigKey(key)) else { return nil }
        let inner = text.trimmingCharacters(in: CharacterSet(charactersIn: "[] "))
        return inner.split(separator: ",").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\" ")) }.filter { !$0.isEmpty }
    }
}
