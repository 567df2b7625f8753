import Foundation
import Logging

/// One structured line per event, logfmt style: `time=… level=info msg=request request_id=…`.
/// Metadata is sorted so lines diff cleanly; values with spaces or quotes are quoted.
public struct LogfmtHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level
    let label: String

    public init(label: String, level: Logger.Level) {
        self.label = label
        self.logLevel = level
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let extra = event.metadata { all.merge(extra) { _, new in new } }
        var line = "time=\(Timestamp.format(Date())) level=\(event.level) msg=\(Self.quote(event.message.description))"
        for (key, value) in all.sorted(by: { $0.key < $1.key }) {
            line += " \(key)=\(Self.quote(value.description))"
        }
        line += "\n"
        FileHandle.standardError.write(Data(line.utf8))
    }

    static func quote(_ s: String) -> String {
        if !s.isEmpty && !s.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\n" }) { return s }
        return "\""
            + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n") + "\""
    }
}
