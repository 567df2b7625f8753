import Foundation

/// The OpenAPI document of CapGate's own API (`openapi.yaml` at the repository root).
enum OpenAPIDocument {
    static func text() -> String? {
        var candidates = [FileManager.default.currentDirectoryPath + "/openapi.yaml"]
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        candidates.append(root.appendingPathComponent("openapi.yaml").path)
        for path in candidates {
            if let text = try? String(contentsOfFile: path, encoding: .utf8) { return text }
        }
        return nil
    }
}
