import Foundation

// The build tool behind the `EmbedResourcesPlugin`: writes a Swift source holding the text of
// the files CapGate serves or applies (`db/`, `console/`, `openapi.yaml`), so the binary alone,
// copied anywhere and run from any folder, has them.
//
// Usage: EmbedResources <output.swift> <package root> <file or folder, relative to the root>...
// A folder's files (not hidden, not in subfolders) are listed here, when it runs, so a file
// added since the plugin last listed them is embedded too.

/// `text` as a Swift string literal: exactly its Unicode scalars, control characters escaped.
func literal(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\\": out += "\\\\"
        case "\"": out += "\\\""
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        default:
            if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\u{" + String(scalar.value, radix: 16) + "}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
    }
    return out + "\""
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 2 else {
    FileHandle.standardError.write(
        Data("usage: EmbedResources <output.swift> <package root> <file or folder, relative to the root>...\n".utf8))
    exit(2)
}
let output = arguments[0]
let root = URL(fileURLWithPath: arguments[1])
var source = """
    // Generated at build time by EmbedResources from the package's files: do not edit.

    /// The files of `db/`, `console/` and `openapi.yaml` as this binary was built with them, by
    /// their path in the repository.
    enum EmbeddedFiles {
        static let texts: [String: String] = [

    """
let fm = FileManager.default
var paths: [String] = []
for entry in arguments.dropFirst(2) {
    var isFolder: ObjCBool = false
    guard fm.fileExists(atPath: root.appendingPathComponent(entry).path, isDirectory: &isFolder) else {
        FileHandle.standardError.write(Data("EmbedResources: \(entry) does not exist\n".utf8))
        exit(1)
    }
    guard isFolder.boolValue else {
        paths.append(entry)
        continue
    }
    for name in try fm.contentsOfDirectory(atPath: root.appendingPathComponent(entry).path) where !name.hasPrefix(".") {
        var isSubfolder: ObjCBool = false
        if fm.fileExists(atPath: root.appendingPathComponent(entry + "/" + name).path, isDirectory: &isSubfolder),
            !isSubfolder.boolValue
        {
            paths.append(entry + "/" + name)
        }
    }
}
for path in paths.sorted() {
    let bytes = try [UInt8](Data(contentsOf: root.appendingPathComponent(path)))
    guard let text = String(validating: bytes, as: UTF8.self) else {
        FileHandle.standardError.write(Data("EmbedResources: \(path) is not UTF-8 text\n".utf8))
        exit(1)
    }
    source += "        \(literal(path)): \(literal(text)),\n"
}
source += "    ]\n}\n"
// Rewritten only when it changed, so an unchanged set does not recompile CapGate.
if (try? String(contentsOfFile: output, encoding: .utf8)) != source {
    try source.write(toFile: output, atomically: true, encoding: .utf8)
}
