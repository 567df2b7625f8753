/// Splits a SQL script into statements at top-level semicolons, respecting quotes,
/// dollar-quoted bodies and comments (PostgreSQL's extended protocol runs one statement at a time).
enum SQLSplitter {
    static func statements(in sql: String) -> [String] {
        var scanner = Scanner(chars: Array(sql.unicodeScalars))
        while scanner.i < scanner.chars.count { scanner.step() }
        scanner.endStatement()
        return scanner.statements
    }

    /// Reads the script one token at a time: a comment (dropped), a quoted string or identifier,
    /// a dollar-quoted body (kept whole), a semicolon (ends a statement), any other character.
    private struct Scanner {
        let chars: [Unicode.Scalar]
        var i = 0
        var current = String.UnicodeScalarView()
        var statements: [String] = []

        func at(_ offset: Int, is c: Unicode.Scalar) -> Bool { i + offset < chars.count && chars[i + offset] == c }

        mutating func step() {
            let c = chars[i]
            switch c {
            case "-" where at(1, is: "-"):
                while i < chars.count && chars[i] != "\n" { i += 1 }
            case "/" where at(1, is: "*"):
                i += 2
                while i + 1 < chars.count && !(chars[i] == "*" && chars[i + 1] == "/") { i += 1 }
                i += 2
            case "'", "\"":
                copyQuoted(c)
            case "$":
                if let tag = dollarTag() { copyDollarQuoted(tag) } else { copy(1) }
            case ";":
                endStatement()
                i += 1
            default:
                copy(1)
            }
        }

        mutating func copy(_ count: Int) {
            let end = min(i + count, chars.count)
            current.append(contentsOf: chars[i..<end])
            i = end
        }

        /// A string or identifier up to its closing quote; a doubled quote stays inside.
        mutating func copyQuoted(_ quote: Unicode.Scalar) {
            copy(1)
            while i < chars.count {
                if chars[i] == quote {
                    if at(1, is: quote) {
                        copy(2)
                        continue
                    }
                    copy(1)
                    return
                }
                copy(1)
            }
        }

        /// `$tag$` (or `$$`) starting at `i`; nil for a `$` that opens none (a parameter like `$1`).
        func dollarTag() -> [Unicode.Scalar]? {
            var j = i + 1
            while j < chars.count && (chars[j] == "_" || chars[j].properties.isAlphabetic || ("0"..."9").contains(chars[j])) {
                j += 1
            }
            guard j < chars.count && chars[j] == "$" else { return nil }
            return Array(chars[i...j])
        }

        /// A dollar-quoted body, from its opening tag through the same closing tag.
        mutating func copyDollarQuoted(_ tag: [Unicode.Scalar]) {
            copy(tag.count)
            while i < chars.count {
                if chars[i] == "$", i + tag.count <= chars.count, Array(chars[i..<(i + tag.count)]) == tag {
                    copy(tag.count)
                    return
                }
                copy(1)
            }
        }

        mutating func endStatement() {
            let text = String(current).trimmingWhitespace()
            if !text.isEmpty && !text.allSatisfy({ $0 == ";" }) { statements.append(text) }
            current = String.UnicodeScalarView()
        }
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
