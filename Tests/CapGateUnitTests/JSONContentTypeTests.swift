import Testing

@testable import CapGate

/// Which bodies CapGate reads as JSON by their `content-type` (``CallBody/isJSON(_:)``): the
/// byte-level reading of an ASCII header answers exactly as the Unicode one does.
@Suite("JSON content types")
struct JSONContentTypeTests {
    static let headers: [String] = [
        "application/json", "APPLICATION/JSON", "application/json; charset=utf-8", "application/json ;charset=utf-8",
        "application/json\t", "  application/json  ", "application/vnd.api+json", "application/problem+JSON; q=1",
        "text/json", "application/jsonx", "application/json-seq", "application/xjson", "json", "+json", "/json", "",
        ";application/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=json",
        "application/js\u{6F}n", "application/jsoN", "application/jSon;", "application/json\n", "application/json\r",
        "application/*", "application/JS0N", "application/json\u{0B}",
    ]

    @Test("ASCII headers: the byte reading agrees with the Unicode one", arguments: headers)
    func agrees(_ header: String) {
        #expect(CallBody.isJSON(header) == CallBody.isJSONUnicode(header), "\(header.debugDescription)")
    }

    @Test("what is JSON and what is not")
    func answers() {
        for header in ["application/json", "Application/JSON; charset=utf-8", "application/ld+json", "text/json \t"] {
            #expect(CallBody.isJSON(header), "\(header)")
        }
        for header in ["application/jsonx", "json", "multipart/form-data; boundary=x/json", "application/json\n", ""] {
            #expect(!CallBody.isJSON(header), "\(header.debugDescription)")
        }
        #expect(!CallBody.isJSON(nil))
        // Non-ASCII: read with Unicode white space (a no-break space trimmed) and case.
        #expect(CallBody.isJSON("application/json\u{A0}"))
        #expect(!CallBody.isJSON("application/jſon"))
    }
}
