import NIOCore

extension JSONParser {
    /// The value of `key` in a top-level object as the provider reads it: when the key is
    /// repeated, the last occurrence (as most JSON parsers do). Reads the whole object, building
    /// only the key's values; nil when the text is not an object or lacks the key. A text broken
    /// off after the key keeps what was read.
    static func lastTopLevelValue(_ key: String, in bytes: [UInt8]) -> JSON? {
        var found: JSON?
        scanTopLevel(bytes, wants: { $0 == key }) { _, value in
            found = value
            return true
        }
        return found
    }
}

extension JSON {
    /// The string value of `key` in a top-level JSON object, the last occurrence when repeated.
    static func lastTopLevelString(_ key: String, in buffer: ByteBuffer) -> String? {
        JSONParser.lastTopLevelValue(key, in: Array(buffer.readableBytesView))?.stringValue
    }
}
