/// The OpenAPI document of CapGate's own API (`openapi.yaml` at the repository root, built into
/// the binary).
enum OpenAPIDocument {
    static func text() -> String? {
        EmbeddedFiles.text("openapi.yaml")
    }
}
