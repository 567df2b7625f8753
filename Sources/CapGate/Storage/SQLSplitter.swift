/// Splits a SQL script into statements at top-level semicolons, respecting quotes,
/// dollar-quoted bodies and comments (PostgreSQL's extended protocol runs one statement at a time).
enum SQLSplitter {
    static func statements(in sql: String) -> [String] {
        let chars = Array(sql.unicodeScalars)
        var statements: [String] = []
        var current = String.UnicodeScalarView()
        var i = 0
        var dollarTag: [Unicode.Scalar]? = nil

        func flush() {
            let text = String(current).trimmingWhitespace()
            if !text.isEmpty && !text.allSatisfy({ $0 == ";" }) { statements.append(text) }
            current = String.UnicodeScalarView()
        }

        while i < chars.count {
            let c = chars[i]
            if let tag = dollarTag {
                if c == "$", i + tag.count <= chars.count, Array(chars[i..<(i + tag.count)]) == tag {
                    current.append(contentsOf: tag)
                    i += tag.count
                    dollarTag = nil
                } else {
                    current.append(c)
                    i += 1
                }
                continue
            }
            switch c {
            case "-" where i + 1 < chars.count && chars[i + 1] == "-":
                while i < chars.count && chars[i] != "\n" { i += 1 }
            case "/" where i + 1 < chars.count && chars[i + 1] == "*":
                i += 2
                while i + 1 < chars.count && !(chars[i] == "*" && chars[i + 1] == "/") { i += 1 }
                i += 2
            case "'", "\"":
                current.append(c)
                i += 1
                while i < chars.count {
                    current.append(chars[i])
                    if chars[i] == c {
                        if i + 1 < chars.count && chars[i + 1] == c {
                            current.append(chars[i + 1])
                            i += 2
                            continue
                        }
                        i += 1
                        break
                    }
                    i += 1
                }
            case "$":
                var j = i + 1
                while j < chars.count && (chars[j] == "_" || chars[j].properties.isAlphabetic || ("0"..."9").contains(chars[j])) {
                    j += 1
                }
                if j < chars.count && chars[j] == "$" {
                    let tag = Array(chars[i...j])
                    current.append(contentsOf: tag)
                    dollarTag = tag
                    i = j + 1
                } else {
                    current.append(c)
                    i += 1
                }
            case ";":
                flush()
                i += 1
            default:
                current.append(c)
                i += 1
            }
        }
        flush()
        return statements
    }
}

extension String {
    package func trimmingWhitespace() -> String {
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s = s.dropFirst() }
        while let l = s.last, l.isWhitespace { s = s.dropLast() }
        return String(s)
    }
}
