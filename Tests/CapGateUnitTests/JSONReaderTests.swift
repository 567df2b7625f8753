import NIOCore
import Testing

@testable import CapGate

/// The strict I-JSON reader (Support/JSONParser.swift) on bad input, as SPEC §2 lists it: one
/// text, valid UTF-8, no repeated member names at any depth, no lone surrogate escapes, only
/// RFC 8259 tokens, numbers a double can hold, nesting at most `proxy.maxJSONDepth`, nothing
/// after the value. Each refusal says what is wrong and at which byte.
@Suite("I-JSON reader: what it refuses and why")
struct JSONReaderTests {
    static func failure(_ text: String, maxDepth: Int = JSONParser.defaultMaxDepth) -> JSONParser.Failure? {
        UnitTestSupport.jsonFailure(text, maxDepth: maxDepth)
    }

    /// A string value made of raw bytes between quotes.
    static func quoted(_ bytes: [UInt8]) -> [UInt8] { [0x22] + bytes + [0x22] }

    @Test("a repeated member name is refused at any depth, naming it and the byte where it repeats")
    func duplicateNames() {
        #expect(Self.failure(#"{"a":1,"a":2}"#)?.description == #"the member name "a" appears twice in one object (at byte 7)"#)
        #expect(Self.failure(#"{"x":{"b":1,"b":2}}"#)?.reason == #"the member name "b" appears twice in one object"#)
        #expect(Self.failure(#"[{"k":1},{"k":{"k":[{"z":1,"z":null}]}}]"#)?.reason.contains(#""z""#) == true)
        // The same name in different objects, or in an object and one nested in it, is no repeat;
        // names are compared exactly (case matters).
        for text in [#"[{"k":1},{"k":2}]"#, #"{"a":{"a":{"a":1}}}"#, #"{"A":1,"a":2}"#, #"{"a":1,"a ":2}"#, #"{"":1," ":2}"#] {
            #expect(Self.failure(text) == nil, "\(text)")
        }
        #expect(Self.failure(#"{"":1,"":2}"#) != nil)
    }

    @Test("names are compared after unescaping: an escaped spelling of a name already seen is a repeat")
    func escapedDuplicates() {
        for text in [
            #"{"a":1,"\u0061":2}"#, #"{"\u0061":1,"a":2}"#, #"{"é":1,"\u00e9":2}"#, #"{"\u00E9":1,"\u00e9":2}"#,
            #"{"a/b":1,"a\/b":2}"#, #"{"😀":1,"\ud83d\ude00":2}"#, #"{"\n":1,"\u000a":2}"#,
        ] {
            #expect(Self.failure(text)?.reason.hasSuffix("appears twice in one object") == true, "\(text)")
        }
        #expect(Self.failure(#"{"\u0061":1,"\u0062":2}"#) == nil)
    }

    @Test("past 16 members the repeat check is hashed: a repeat is still found, escaped or not, and distinct names pass")
    func manyMembers() {
        let names = (0..<40).map { "\"name\($0)\":\($0)" }
        #expect(Self.failure("{" + names.joined(separator: ",") + "}") == nil)
        #expect(Self.failure("{" + names.joined(separator: ",") + #","name3":0}"#)?.reason.contains(#""name3""#) == true)
        #expect(Self.failure("{" + names.joined(separator: ",") + #","\u006eame39":0}"#)?.reason.contains(#""name39""#) == true)
        // The 17th member repeats the 1st: the switch to the hash set keeps every name seen.
        let seventeen = (0..<17).map { "\"n\($0)\":0" } + [#""n0":1"#]
        #expect(Self.failure("{" + seventeen.joined(separator: ",") + "}") != nil)
    }

    @Test("nesting: objects and arrays both count; exactly maxDepth levels pass, one more is refused where it opens")
    func depth() {
        #expect(Self.failure("[[[1]]]", maxDepth: 3) == nil)
        #expect(Self.failure("[[[[1]]]]", maxDepth: 3)?.description == "the JSON nests deeper than 3 levels (at byte 3)")
        #expect(Self.failure(#"{"a":[{"b":[1]}]}"#, maxDepth: 4) == nil)
        #expect(Self.failure(#"{"a":[{"b":[1]}]}"#, maxDepth: 3)?.reason == "the JSON nests deeper than 3 levels")
        #expect(Self.failure("1", maxDepth: 0) == nil)
        #expect(Self.failure("{}", maxDepth: 0) != nil)
        let deepest = String(repeating: "[", count: 128) + String(repeating: "]", count: 128)
        #expect(Self.failure(deepest) == nil)
        #expect(Self.failure("[" + deepest + "]")?.reason == "the JSON nests deeper than 128 levels")
    }

    @Test("numbers: integers up to Int64 are integers, larger ones and fractions are doubles, exactly as written")
    func numbersRead() throws {
        let cases: [(String, JSON)] = [
            ("0", .int(0)), ("-0", .int(0)), ("42", .int(42)), ("9223372036854775807", .int(.max)),
            ("-9223372036854775808", .int(.min)), ("9223372036854775808", .double(9.223372036854775808e18)),
            ("0.1", .double(0.1)), ("-2.5E+3", .double(-2_500)), ("1e-2", .double(0.01)), ("1E2", .double(100)),
        ]
        for (text, value) in cases {
            #expect(try JSONParser.parse(Array(text.utf8)) == value, "\(text)")
        }
        #expect(try JSONParser.parse(Array("5.0".utf8)).intValue == 5)
        #expect(try JSONParser.parse(Array("5.5".utf8)).intValue == nil)
    }

    @Test("numbers outside RFC 8259 or a double's range are refused with the reason")
    func numbersRefused() {
        let cases: [(String, String)] = [
            ("01", "a number cannot have a leading zero"), ("-01", "a number cannot have a leading zero"),
            ("-", "a number needs a digit after '-'"), ("-Infinity", "a number needs a digit after '-'"),
            ("1.", "a number needs a digit after '.'"), ("1.e3", "a number needs a digit after '.'"),
            ("1e", "a number needs a digit in its exponent"), ("1e+", "a number needs a digit in its exponent"),
            ("1E400", "the number 1E400 is too large for a double"), ("-1e400", "the number -1e400 is too large for a double"),
            ("0x10", "there is more after the JSON value"), ("1 2", "there is more after the JSON value"),
        ]
        for (text, reason) in cases {
            #expect(Self.failure(text)?.reason == reason, "\(text)")
        }
        for text in ["+1", ".5", "NaN", "Infinity"] {
            #expect(Self.failure(text)?.reason.hasPrefix("a value cannot start with") == true, "\(text)")
        }
        #expect(Self.failure("[0,1e400]")?.offset == 3)
        #expect(Self.failure("[1,01]")?.offset == 4)
    }

    @Test("escapes: \\u with 4 hex digits (either case), surrogates only in pairs, the eight short ones, nothing else")
    func escapes() throws {
        let read: [(String, String)] = [
            (#""\u00e9""#, "é"), (#""\u00E9""#, "é"), (#""\ud83d\ude00""#, "😀"), (#""\uDBFF\uDFFF""#, "\u{10FFFF}"),
            (#""\u0000""#, "\u{0}"), (#""\"\\\/\b\f\n\r\t""#, "\"\\/\u{8}\u{C}\n\r\t"),
        ]
        for (text, value) in read {
            #expect(try JSONParser.parse(Array(text.utf8)) == .string(value), "\(text)")
        }
        let refused: [(String, String)] = [
            (#""\ud800""#, #"a string holds a lone high surrogate escape (\uD800)"#),
            (#""\ud800\u0041""#, #"a string holds a lone high surrogate escape (\uD800)"#),
            (#""\ud800\n""#, #"a string holds a lone high surrogate escape (\uD800)"#),
            (#""\udfff""#, #"a string holds a lone low surrogate escape (\uDFFF)"#),
            (#""\ude00\ud83d""#, #"a string holds a lone low surrogate escape (\uDE00)"#),
            (#""\u12""#, #"a \u escape needs 4 hex digits"#), (#""\u12G4""#, #"a \u escape needs 4 hex digits"#),
            (#""\x41""#, #"a string holds an unknown escape '\x'"#), (#""\'""#, #"a string holds an unknown escape '\''"#),
        ]
        for (text, reason) in refused {
            #expect(Self.failure(text)?.reason == reason, "\(text)")
        }
    }

    @Test("UTF-8: every well-formed sequence up to U+10FFFF reads; overlong forms, surrogates, stray and cut bytes are refused")
    func utf8() throws {
        let valid: [([UInt8], String)] = [
            ([0xC3, 0xA9], "é"), ([0xE2, 0x82, 0xAC], "€"), ([0xED, 0x9F, 0xBF], "\u{D7FF}"), ([0xEF, 0xBF, 0xBF], "\u{FFFF}"),
            ([0xF0, 0x9F, 0x98, 0x80], "😀"), ([0xF4, 0x8F, 0xBF, 0xBF], "\u{10FFFF}"),
        ]
        for (bytes, value) in valid {
            #expect(try JSONParser.parse(Self.quoted(bytes)) == .string(value), "\(bytes)")
        }
        let invalid: [[UInt8]] = [
            [0xC0, 0x80], [0xC1, 0xBF], [0xE0, 0x80, 0x80], [0xE0, 0x9F, 0xBF], [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF],
            [0xF0, 0x80, 0x80, 0x80], [0xF0, 0x8F, 0xBF, 0xBF], [0xF4, 0x90, 0x80, 0x80], [0xF5, 0x80, 0x80, 0x80], [0xFF], [0x80],
            [0xC3], [0xE2, 0x82], [0xE2, 0x28, 0xA1],
        ]
        for bytes in invalid {
            #expect(UnitTestSupport.jsonFailure(bytes: Self.quoted(bytes))?.reason == "the body is not valid UTF-8", "\(bytes)")
        }
    }

    @Test("a body cut anywhere is refused: every proper prefix of a valid text fails inside the text")
    func truncated() {
        let text = #"{"a":[1,-2.5e3,{"b":"cé\u00e9"}],"d":true,"e":null}"#
        let bytes = Array(text.utf8)
        #expect(UnitTestSupport.jsonFailure(bytes: bytes) == nil)
        for length in 0..<bytes.count {
            let failure = UnitTestSupport.jsonFailure(bytes: Array(bytes.prefix(length)))
            #expect(failure != nil, "\(length) bytes")
            #expect((failure?.offset ?? .max) <= length, "\(length) bytes")
        }
        #expect(Self.failure("")?.reason == "the JSON text ends where a value should be")
        #expect(Self.failure(#"{"a":"b"#)?.reason == "the JSON text ends inside a string")
        #expect(Self.failure(#"{"a":1"#)?.reason == "the JSON text ends inside an object")
        #expect(Self.failure("[1")?.reason == "the JSON text ends inside an array")
    }

    @Test("only RFC 8259 tokens and whitespace: no BOM, comments, single quotes, bare words, trailing commas or raw controls")
    func tokens() {
        let cases: [(String, String)] = [
            ("\u{FEFF}{}", "a value cannot start with '0xEF'"), ("/* c */ 1", "a value cannot start with '/'"),
            ("{'a':1}", "an object member must start with a quoted name"), ("{a:1}", "an object member must start with a quoted name"),
            (#"{"a":1,}"#, "an object member must start with a quoted name"), ("[1,]", "a value cannot start with ']'"),
            (#"{"a" 1}"#, "a ':' must follow an object member's name"),
            ("[1 2]", "an array's elements must be separated by ',' and closed by ']'"),
            (#"{"a":1 "b":2}"#, "an object's members must be separated by ',' and closed by '}'"),
            ("True", "a value cannot start with 'T'"),
            ("nul", "unknown literal (only true, false and null)"), ("nulL", "unknown literal (only true, false and null)"),
            ("undefined", "a value cannot start with 'u'"), ("\u{0C}1", "a value cannot start with '0xC'"),
            ("\u{A0}1", "a value cannot start with '0xC2'"), ("\"a\u{1F}\"", "a string holds a raw control character (U+001F); escape it"),
        ]
        for (text, reason) in cases {
            #expect(Self.failure(text)?.reason.hasPrefix(reason) == true, "\(text.debugDescription)")
        }
        #expect(Self.failure(" \t\r\n[ 1 ,\t2 ]\r\n") == nil)
    }

    @Test("nothing after the value but whitespace: a second value, a NUL or garbage is refused where it starts")
    func trailing() {
        #expect(Self.failure("{} {}")?.description == "there is more after the JSON value (at byte 3)")
        #expect(Self.failure("[1]x")?.offset == 3)
        #expect(Self.failure("\"a\"\u{0}")?.offset == 3)
        #expect(Self.failure("truex")?.reason == "there is more after the JSON value")
        #expect(Self.failure("{}\n\t ") == nil)
    }

    @Test("top-level members: the named ones built, every top-level array counted, nested arrays not; a non-object gives nothing")
    func members() throws {
        let text = #"{"model":"m","requests":[1,[2,3],{"x":[4]}],"tools":[],"meta":{"list":[1,2]},"n":1}"#
        let top = try JSONParser.members(["model", "tools"], in: ByteBuffer(string: text))
        #expect(top.isObject)
        #expect(top.values.keys.sorted() == ["model", "tools"])
        #expect(top.values["model"] == .string("m") && top.values["tools"] == .array([]))
        #expect(top.arrayCounts == ["requests": 3, "tools": 0])
        let list = try JSONParser.members(["model"], in: ByteBuffer(string: #"[{"model":"m"}]"#))
        #expect(!list.isObject && list.values.isEmpty && list.arrayCounts.isEmpty)
        #expect(throws: JSONParser.Failure.self) {
            try JSONParser.members(["model"], in: ByteBuffer(string: #"{"model":"m","meta":{"k":1,"k":2}}"#))
        }
    }

    @Test("writing: the envelope's escapes (quotes, backslashes, controls as \\u00XX), whole doubles bare, non-finite as null")
    func writing() throws {
        let value = JSON.obj([
            "s": .string("q\"\\\u{1}\n\r\t\u{1F}é"), "whole": .double(3), "half": .double(2.5), "nan": .double(.nan),
            "list": .array([.null, .bool(false), .int(-7)]),
        ])
        #expect(value.serialized() == #"{"s":"q\"\\\u0001\n\r\t\u001fé","whole":3,"half":2.5,"nan":null,"list":[null,false,-7]}"#)
        #expect(try JSONParser.parse(Array(value.serialized().utf8))["s"] == value["s"])
    }

    @Test("a claim path walks nested objects by dots; a missing step or a non-object on the way is nil")
    func paths() {
        let claims = JSON.obj(["company_id": "top", "app_metadata": .obj(["company_id": "nested", "org": .obj(["id": 7])])])
        #expect(claims.value(atPath: "company_id") == .string("top"))
        #expect(claims.value(atPath: "app_metadata.company_id") == .string("nested"))
        #expect(claims.value(atPath: "app_metadata.org.id") == .int(7))
        #expect(claims.value(atPath: "app_metadata.missing") == nil)
        #expect(claims.value(atPath: "company_id.inner") == nil)
    }
}
