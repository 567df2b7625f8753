import Logging
import Synchronization

/// Keeps the lines a logger writes, for tests that check what the gateway logged: each as
/// `level message key=value …` (metadata sorted by key).
final class LogCapture: Sendable {
    private let lines = Mutex<[String]>([])

    /// A logger at `level` whose lines are kept here.
    func logger(level: Logger.Level = .info) -> Logger {
        var logger = Logger(label: "capgate-captured") { _ in Handler(capture: self) }
        logger.logLevel = level
        return logger
    }

    var all: [String] { lines.withLock { $0 } }

    /// The kept lines that contain `text`.
    func matching(_ text: String) -> [String] { all.filter { $0.contains(text) } }

    struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
            let fields = merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
            let line = (["\(event.level)", event.message.description] + fields).joined(separator: " ")
            capture.lines.withLock { $0.append(line) }
        }
    }
}
