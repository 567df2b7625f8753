import Foundation
import PackagePlugin

/// Embeds `db/migrations/`, `db/functions/`, `console/` and `openapi.yaml` (at the package root,
/// where the README and the docs point) into the target as `EmbeddedFiles`, so `capgate` finds
/// them the same way from any working directory, with nothing beside it.
///
/// The command's inputs are the folders (a file added or removed changes its folder) and every
/// file in them (an edit); the `EmbedResources` tool lists the folders itself when it runs.
/// SwiftPM runs this plugin again only when the package's structure changes (the manifest, the
/// targets' folders), not at every build. Until it does, a file added since is embedded but its
/// later edits are not seen, and a file removed since stops the build with "missing inputs"
/// naming it: `touch Package.swift` makes SwiftPM plan again.
@main
struct EmbedResourcesPlugin: BuildToolPlugin {
    static let folders = ["db/migrations", "db/functions", "console"]
    static let files = ["openapi.yaml", "certificates/AppleRootCA-G3.pem"]

    func createBuildCommands(context: PluginContext, target: any Target) async throws -> [Command] {
        let root = context.package.directoryURL
        var inputs = (Self.folders + Self.files).map { root.appendingPathComponent($0) }
        for folder in Self.folders {
            let names = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent(folder).path)
            inputs += names.filter { !$0.hasPrefix(".") }.sorted().map { root.appendingPathComponent(folder + "/" + $0) }
        }
        let output = context.pluginWorkDirectoryURL.appendingPathComponent("EmbeddedFiles.swift")
        return [
            .buildCommand(
                displayName: "Embedding the db, console and openapi.yaml files into \(target.name)",
                executable: try context.tool(named: "EmbedResources").url,
                arguments: [output.path, root.path] + Self.folders + Self.files,
                inputFiles: inputs,
                outputFiles: [output]
            )
        ]
    }
}
