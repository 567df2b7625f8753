import CapGateDev
import Foundation
import NIOCore
import Testing

@testable import CapGate

/// SPEC §2, "what is charged is what the provider reads": CapGate's one JSON reader accepts a
/// body only when it is one I-JSON text, and then reads it as every other reader does. Proved on
/// examples and by a differential test against Python's `json` (what a provider written in
/// Python, and in effect Go or JavaScript, reads: the last of repeated names, lone surrogates,
/// `NaN`): for every generated hostile body CapGate either refuses it or agrees with Python on the
/// `model` and the number of `requests`.
@Suite("The I-JSON body reader", .timeLimit(.minutes(10)))
struct IJSONReaderTests {
    static func read(_ text: String, maxDepth: Int = 128) throws(JSONParser.Failure) -> JSONParser.TopLevel {
        try JSONParser.members(["model"], in: ByteBuffer(string: text), maxDepth: maxDepth)
    }

    static func read(bytes: [UInt8], maxDepth: Int = 128) throws(JSONParser.Failure) -> JSONParser.TopLevel {
        try JSONParser.members(["model"], in: ByteBuffer(bytes: bytes), maxDepth: maxDepth)
    }

    @Test(
        "refused, with the reason: repeated names at any depth (escaped or not), lone surrogates, NaN and Infinity, BOM, trailing text, bad UTF-8, deep nesting, huge numbers",
        arguments: [
            (#"{"requests":[1],"\udc00":0,"requests":[1,2,3]}"#, "lone low surrogate"),
            (#"{"requests":[1],"requests":[1,2]}"#, "\"requests\" appears twice"),
            (#"{"model":"a","mod\u0065l":"b"}"#, "\"model\" appears twice"),
            (#"{"m":{"x":1,"y":{"z":2},"x":3}}"#, "\"x\" appears twice"),
            (#"[{"a":1,"a":1}]"#, "\"a\" appears twice"),
            (#"{"a":"\ud800"}"#, "lone high surrogate"),
            (#"{"a":"\ud800\u0041"}"#, "lone high surrogate"),
            (#"{"a":NaN}"#, "NaN"),
            (#"{"a":-Infinity}"#, "a number needs a digit"),
            (#"{"a":Infinity}"#, "cannot start"),
            ("\u{FEFF}{\"a\":1}", "BOM"),
            (#"{"a":1} x"#, "more after"),
            (#"{"a":1}{"a":2}"#, "more after"),
            (#"{"a":1e400}"#, "too large"),
            (#"{"a":-1e309}"#, "too large"),
            (#"{"a":01}"#, "leading zero"),
            (#"{"a":"\x"}"#, "unknown escape"),
            ("{\"a\":\"\t\"}", "control character"),
            (#"{'a':1}"#, "quoted name"),
            (#"{"a":1,}"#, "quoted name"),
            (#"{"a":1 // comment"#, "separated"),
            ("{\"a\":1}\u{00A0}", "more after"),
        ])
    func refused(body: String, reason: String) {
        #expect {
            _ = try Self.read(body)
        } throws: { error in
            (error as? JSONParser.Failure)?.reason.contains(reason) == true
        }
    }

    @Test("bad UTF-8 is refused anywhere, in names and values: overlong, encoded surrogates, past U+10FFFF, truncated, stray bytes")
    func badUTF8() {
        let open = Array(#"{"a":""#.utf8)
        let close = Array(#""}"#.utf8)
        for bad: [UInt8] in [
            [0xC0, 0xAF], [0xE0, 0x80, 0xAF], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xF5], [0xFF], [0x80], [0xE2, 0x82],
        ] {
            #expect(throws: JSONParser.Failure.self, "\(bad)") { _ = try Self.read(bytes: open + bad + close) }
            #expect(throws: JSONParser.Failure.self, "\(bad)") { _ = try Self.read(bytes: [0x7B, 0x22] + bad + Array(#"":1}"#.utf8)) }
        }
        // Good multi-byte text of every length passes and reads back the same.
        let text = #"{"model":"é€😀 ok"}"#
        #expect((try? Self.read(text))?.values["model"] == .string("é€😀 ok"))
    }

    @Test("nesting is bounded by proxy.maxJSONDepth: 128 levels pass, 129 are refused, at any position")
    func depth() throws {
        func nested(_ n: Int) -> String {
            #"{"model":"m","x":"# + String(repeating: "[", count: n - 1) + String(repeating: "]", count: n - 1) + "}"
        }
        #expect(try Self.read(nested(128)).values["model"] == .string("m"))
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(nested(129)) }
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(nested(5), maxDepth: 4) }
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(String(repeating: "[", count: 100_000)) }
        let objects = String(repeating: #"{"a":"#, count: 200) + "1" + String(repeating: "}", count: 200)
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(objects) }
    }

    @Test("a valid body: model built, top-level arrays counted, nested names and strings are not members; escapes decode")
    func accepted() throws {
        let body = #"""
            {"model":"claude-\u0078","requests":[{"params":{"model":"inner","requests":[1,2]}},{"a":[]},3],
             "nested":{"model":"n"},"s":"\"model\":\"fake\"","pair":"\ud83d\ude00","n":[-0,1.5e3,-2E-2,12345678901234567890],
             "big":{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,
                    "k14":14,"k15":15,"k16":16,"k17":17,"k18":18}}
            """#
        let top = try Self.read(body)
        #expect(top.isObject)
        #expect(top.values["model"] == .string("claude-x"))
        #expect(top.arrayCounts["requests"] == 3)
        #expect(top.arrayCounts["n"] == 4)
        #expect(top.arrayCounts["nested"] == nil)
        let parsed = try JSONParser.parse(Array(body.utf8))
        #expect(parsed["pair"] == .string("😀"))
        #expect(parsed["s"] == .string(#""model":"fake""#))
        // A repeat past the hash-set threshold is still found.
        var names = (0..<40).map { #""k\#($0)":\#($0)"# }
        names.append(#""k\u0033\u0037":0"#)
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read("{" + names.joined(separator: ",") + "}") }
        // Long names, escaped and not, compared by their decoded text (each decoded once).
        let long = String(repeating: "ab", count: 50_000)
        let escapedLong = String(repeating: "a\\u0062", count: 50_000)
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(#"{"\#(long)":1,"x":2,"\#(escapedLong)":3}"#) }
        #expect(throws: JSONParser.Failure.self) { _ = try Self.read(#"{"\#(escapedLong)":1,"\#(long)":3}"#) }
        #expect(try Self.read(#"{"\#(long)a":1,"\#(escapedLong)":2,"x":{"\#(long)":3,"\#(escapedLong)b":4}}"#).isObject)
        // Not an object: valid, nothing to read.
        #expect(try Self.read(#"["model"]"#).isObject == false)
        #expect(try Self.read(#"  "text"  "#).values.isEmpty)
    }

    @Test("admin bodies go through the same reader: a repeated field is 400, not the first or last value")
    func adminBodies() {
        #expect(throws: JSONParser.Failure.self) {
            _ = try JSON.parse(Array(#"{"monthly_company_cap":5,"monthly_company_cap":null}"#.utf8))
        }
    }

    // MARK: - Differential: CapGate against Python's json

    /// A hostile body: a batch-like object with `model` and `requests`, then zero to three
    /// mutations of the kinds a tenant who wants free calls would try.
    static func hostileBody(_ g: inout SeededGenerator) -> (bytes: [UInt8], clean: Bool) {
        func pick<T>(_ options: [T]) -> T { options[Int.random(in: 0..<options.count, using: &g)] }
        func name(_ plain: String) -> String {
            // The same name written with escapes: readers that compare raw text miss the repeat.
            guard Bool.random(using: &g) else { return plain }
            return plain.unicodeScalars.map { Bool.random(using: &g) ? String(format: "\\u%04x", $0.value) : String($0) }.joined()
        }
        let request = #"{"custom_id":"r","params":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}}"#
        func requests(_ n: Int) -> String { "[" + Array(repeating: request, count: n).joined(separator: ",") + "]" }
        let model = pick(["claude-haiku", "claude-opus", "caf\\u00e9", "\\ud83d\\ude00x", ""])
        var members = [
            #""model":"\#(model)""#, #""requests":\#(requests(Int.random(in: 1...3, using: &g)))"#, #""max_tokens":16"#,
        ]
        if Bool.random(using: &g) { members.append(#""metadata":{"user_id":"u","tags":["a","b"],"n":1.5e2}"#) }
        members.shuffle(using: &g)
        var text = "{" + members.joined(separator: pick([",", ", ", ",\n"])) + "}"
        let mutations = Int.random(in: 0...3, using: &g)
        var prefix: [UInt8] = []
        var suffix: [UInt8] = []
        for _ in 0..<mutations {
            let insertAt = text.index(before: text.endIndex)
            switch Int.random(in: 0..<15, using: &g) {
            case 0: text.insert(contentsOf: #","\#(name("requests"))":\#(requests(Int.random(in: 50...100, using: &g)))"#, at: insertAt)
            case 1: text.insert(contentsOf: #","\#(name("model"))":"claude-opus-expensive""#, at: insertAt)
            case 2: text.insert(contentsOf: #","\#(pick(["\\udc00", "\\ud800", "a\\udfff", "\\ud800\\u0041"])):0"#, at: insertAt)
            case 3:
                text.insert(
                    contentsOf: #","x":\#(pick(["NaN", "Infinity", "-Infinity", "nan", "+1", ".5", "0x10", "1.", "01"]))"#, at: insertAt)
            case 4:
                let depth = Int.random(in: 100...200, using: &g)
                text.insert(
                    contentsOf: #","deep":"# + String(repeating: "[", count: depth) + String(repeating: "]", count: depth), at: insertAt)
            case 5:
                text.insert(
                    contentsOf: #","n":\#(pick(["1e400", "-1e400", "1e-400", "123456789012345678901234567890", "1E+308", "2e308"]))"#,
                    at: insertAt)
            case 6: prefix = [0xEF, 0xBB, 0xBF]
            case 7: suffix = Array(pick([" x", "}", "{\"requests\":[]}", "\n\n", " \t", "\u{0}", "]"]).utf8)
            case 8: text.insert(contentsOf: #","meta":{"k":1,"\#(name("k"))":2}"#, at: insertAt)
            case 9: text.insert(contentsOf: #","s":"\#(pick(["\\u00", "\\q", "\t", "ok\\/ok", "\\uD834\\uDD1E"]))""#, at: insertAt)
            case 10: suffix = [pick([0xFF, 0xC0, 0x80, 0xED])]
            case 11 where text.count > 1: text = String(text.prefix(Int.random(in: 1..<text.count, using: &g)))
            case 12: text.insert(contentsOf: #","\#(name("requests"))":\#(pick(["[]", "{}", "null", "\"many\"", "[[]]"]))"#, at: insertAt)
            case 13:
                // Content blocks that bound a cost (SPEC §11), their names and types maybe escaped.
                let blocks = (0..<Int.random(in: 1...4, using: &g)).map { _ in
                    let control = Bool.random(using: &g) ? #","\#(name("cache_control"))":{"type":"ephemeral"}"# : ""
                    let type = pick(["image", "im\\u0061ge", "text", "document", "\\u0064ocument"])
                    return #"{"\#(name("type"))":"\#(type)","source":{"type":"base64","data":"AA"}\#(control)}"#
                }
                text.insert(
                    contentsOf: #","\#(name("messages"))":[{"role":"user","content":[\#(blocks.joined(separator: ","))]}]"#, at: insertAt)
            default: text = text.replacingOccurrences(of: ":", with: pick([" :", ": ", ":\u{00A0}", "\u{3000}:"]))
            }
        }
        return (prefix + Array(text.utf8) + suffix, mutations == 0)
    }

    @Test("differential: 3,000 hostile bodies; each is refused or read exactly as Python's json reads it")
    func differentialAgainstPython() async throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        var g = SeededGenerator(state: seed)
        let bodies = (0..<3000).map { _ in Self.hostileBody(&g) }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("ijson-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let input = folder.appendingPathComponent("bodies.txt")
        try bodies.map { Data($0.bytes).base64EncodedString() }.joined(separator: "\n").write(to: input, atomically: true, encoding: .utf8)
        let script = """
            import base64, json, sys
            for line in open(sys.argv[1]):
                try:
                    value = json.loads(base64.b64decode(line))
                except Exception:
                    print("refused")
                    continue
                model = value.get("model") if isinstance(value, dict) else None
                requests = value.get("requests") if isinstance(value, dict) else None
                shape = {"images": 0, "documents": 0, "cached": False}
                def walk(v):
                    if isinstance(v, dict):
                        if v.get("type") == "image": shape["images"] += 1
                        if v.get("type") == "document": shape["documents"] += 1
                        if "cache_control" in v: shape["cached"] = True
                        for x in v.values(): walk(x)
                    elif isinstance(v, list):
                        for x in v: walk(x)
                walk(value)
                print(json.dumps({"model": model if isinstance(model, str) else None,
                                  "requests": len(requests) if isinstance(requests, list) else None, **shape}))
            """
        let output = try await Self.runPython(script, argument: input.path)
        let lines = output.split(separator: "\n", omittingEmptySubsequences: false).prefix(bodies.count)
        try #require(lines.count == bodies.count, "python answered \(lines.count) lines for \(bodies.count) bodies")
        var accepted = 0
        var refusedByBoth = 0
        var withImages = 0
        for (body, line) in zip(bodies, lines) {
            let shown = String(decoding: body.bytes.prefix(300), as: UTF8.self)
            guard let ours = try? Self.read(bytes: body.bytes) else {
                #expect(!body.clean, "seed \(seed): a clean body was refused: \(shown)")
                if line == "refused" { refusedByBoth += 1 }
                continue
            }
            accepted += 1
            #expect(line != "refused", "seed \(seed): CapGate read a body Python refuses: \(shown)")
            guard line != "refused" else { continue }
            let theirs = try JSONParser.parse(Array(line.utf8))
            let ourModel = ours.values["model"]?.stringValue
            let ourCount = ours.arrayCounts["requests"]
            #expect(theirs["model"]?.stringValue == ourModel, "seed \(seed): model differs for \(shown)")
            #expect(theirs["requests"]?.intValue.map(Int.init) == ourCount, "seed \(seed): requests differ for \(shown)")
            // The prompt bound's reading (images, documents, caching) agrees too.
            let shape = try? JSONParser.shape(in: ByteBuffer(bytes: body.bytes))
            #expect(shape?.images == theirs["images"]?.intValue.map(Int.init), "seed \(seed): images differ for \(shown)")
            #expect(shape?.documents == theirs["documents"]?.intValue.map(Int.init), "seed \(seed): documents differ for \(shown)")
            #expect(shape?.cached == theirs["cached"]?.boolValue, "seed \(seed): caching differs for \(shown)")
            if (shape?.images ?? 0) > 0 { withImages += 1 }
        }
        // The generator must produce both kinds, or the test proves nothing.
        #expect(accepted > 300, "seed \(seed): only \(accepted) bodies were accepted")
        #expect(withImages > 15, "seed \(seed): only \(withImages) accepted bodies had image blocks")
        #expect(refusedByBoth > 100, "seed \(seed): only \(refusedByBoth) bodies were refused by both")
        #expect(bodies.count - accepted - refusedByBoth > 100, "seed \(seed): too few bodies only CapGate refuses")
    }

    struct PythonFailed: Error {
        var status: Int32
    }

    /// Runs `python3 -c script argument` to its end (killed past 5 minutes); what it printed.
    static func runPython(_ script: String, argument: String) async throws -> String {
        let python = try await ChildProcess.run(
            "/usr/bin/env", ["python3", "-c", script, argument], errors: .inherit, name: "python3", timeout: .seconds(300))
        guard python.status == 0 else { throw PythonFailed(status: python.status ?? ChildProcess.lostStatus) }
        return python.outputText
    }
}
