import NIOCore
import Testing

@testable import CapGate

/// The prompt bound of SPEC §11 from the body alone: blocks counted wherever they are nested
/// and however they are escaped, cache requests, and the bound's arithmetic.
@Suite("Prompt bound")
struct PromptBoundTests {
    static func shape(_ body: String) throws -> PromptShape {
        try CallBody.read(ByteBuffer(string: body), contentType: "application/json", maxDepth: 128).promptShape()
    }

    @Test("image and document blocks anywhere: a message's content, a tool result's, the system prompt")
    func blocks() throws {
        let body = #"""
            {"model":"m","max_tokens":64,"system":[{"type":"text","text":"s"}],
             "messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AA"}},
               {"type":"tool_result","content":[{"type":"image","source":{"type":"url","url":"u"}}]},
               {"type":"text","text":"{\"type\":\"image\"} is only text"}]}]}
            """#
        let shape = try Self.shape(body)
        #expect(shape.images == 2 && shape.documents == 0 && !shape.cached)
        #expect(try Self.shape(#"{"messages":[{"content":[{"type":"document","source":{}}]}]}"#).documents == 1)
    }

    @Test("names and types compared after unescaping, as the provider reads them")
    func escapes() throws {
        #expect(try Self.shape(#"{"messages":[{"content":[{"typ\u0065":"im\u0061ge"}]}]}"#).images == 1)
        #expect(try Self.shape(#"{"a":{"cache\u005fcontrol":{"type":"ephemeral"}}}"#).cached)
        #expect(throws: GatewayError.self) { try Self.shape(#"{"content":[{"type":"text","typ\u0065":"image"}]}"#) }
    }

    @Test("cache_control: five minutes by default or as asked; any other ttl counts as the longer cache")
    func cache() throws {
        let plain = try Self.shape(#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}]}"#)
        #expect(plain.cached && !plain.cachedLong)
        #expect(!(try Self.shape(#"{"tools":[{"cache_control":{"type":"ephemeral","ttl":"5m"}}]}"#)).cachedLong)
        #expect(try Self.shape(#"{"tools":[{"cache_control":{"type":"ephemeral","ttl":"1h"}}]}"#).cachedLong)
        #expect(try Self.shape(#"{"tools":[{"cache_control":{"ttl":3600}}]}"#).cachedLong)
    }

    @Test("a body that is not I-JSON is refused whatever its content type; max_tokens only as a whole number")
    func strictness() throws {
        let text = try CallBody.read(ByteBuffer(string: #"{"a":1,"a":2}"#), contentType: "text/plain", maxDepth: 128)
        #expect(throws: GatewayError.self) { try text.promptShape() }
        func maxTokens(_ body: String) throws -> Int64? {
            try CallBody.read(ByteBuffer(string: body), contentType: "application/json", maxDepth: 128).maxTokens
        }
        #expect(try maxTokens(#"{"max_tokens":64000}"#) == 64000)
        for bad in [#"{"max_tokens":-1}"#, #"{"max_tokens":1.5}"#, #"{"max_tokens":"64"}"#, #"{}"#] {
            #expect(try maxTokens(bad) == nil, "\(bad)")
        }
    }

    @Test("the bound: bytes + overhead + images, the whole window with a document, none with server tools or a batch")
    func bound() throws {
        func tokens(_ bytes: Int, _ shape: PromptShape) -> CostBound.Prompt {
            CostBound(
                bodyBytes: bytes, shape: shape, maxTokens: 64, overheadTokens: 1_000, imageTokens: 5_000, largeWindow: false
            ).prompt
        }
        #expect(tokens(500, PromptShape()) == .tokens(1_500))
        #expect(tokens(500, PromptShape(images: 3)) == .tokens(16_500))
        #expect(tokens(500, PromptShape(documents: 1)) == .wholeWindow)
        #expect(tokens(1, PromptShape(images: Int.max / 2)) == .wholeWindow)
        #expect(tokens(500, PromptShape(serverTools: true)) == .cannotBound)
        #expect(tokens(500, PromptShape(batch: true)) == .cannotBound)
        let cached = CostBound(
            bodyBytes: 10, shape: PromptShape(cached: true, cachedLong: true), maxTokens: nil, overheadTokens: 0,
            imageTokens: 0, largeWindow: true)
        #expect(cached.cache == .oneHour && cached.maxTokens == nil && cached.window == 1_000_000)
        let plain = CostBound(
            bodyBytes: 10, shape: PromptShape(), maxTokens: 32, overheadTokens: 0, imageTokens: 0, largeWindow: false)
        #expect(plain.cache == CostBound.Cache.none && plain.maxTokens == 32 && plain.window == nil)
    }

    /// The bound of `body` with the default `costs.*` (1,000 overhead, the published tool figures).
    static func bound(_ body: String) throws -> CostBound {
        CostBound(
            bodyBytes: body.utf8.count, shape: try shape(body), maxTokens: 64, overheadTokens: 1_000, imageTokens: 5_000,
            largeWindow: false)
    }

    @Test(
        "tools the provider defines: each adds its published tokens and the tool-use system prompt once; a type not listed (a server tool, an unknown version) cannot be bounded and is named"
    )
    func providerTools() throws {
        // Custom tools: only their bytes, plus the tool-use system prompt (346).
        let custom = #"{"tools":[{"name":"f","input_schema":{}},{"type":"custom","name":"g"}]}"#
        #expect(try Self.bound(custom).prompt == .tokens(Int64(custom.utf8.count + 1_000 + 346)))
        #expect(try Self.shape(custom).toolTypes.isEmpty && (try Self.shape(custom)).tools == 2)
        // bash (245) and the text editor (700), and computer use (735 + 499), escaped as the provider reads them.
        let client =
            #"{"tools":[{"type":"bash_20250124","name":"bash"},{"typ\u0065":"text_editor_20250728"},{"type":"computer_20250124"}]}"#
        #expect(try Self.bound(client).prompt == .tokens(Int64(client.utf8.count + 1_000 + 346 + 245 + 700 + 1_234)))
        #expect(try Self.bound(client).unknownTool == nil)
        // No tools: no tool-use system prompt.
        #expect(try Self.bound(#"{"model":"m"}"#).prompt == .tokens(Int64(13 + 1_000)))
        for (body, type) in [
            (#"{"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#, "web_search_20250305"),
            (#"{"tools":[{"typ\u0065":"code_execution_20250825"}]}"#, "code_execution_20250825"),
            (#"{"tools":[{"type":"bash_20250124"},{"type":"bash_20990101"}]}"#, "bash_20990101"),
            (#"{"tools":[{"type":"memory_20250818"}]}"#, "memory_20250818"),
        ] {
            let bound = try Self.bound(body)
            #expect(bound.prompt == .cannotBound && bound.unknownTool == type, "\(body)")
        }
        // An operator's list: a new version added, a figure raised.
        let settings = try #require(CostSettings.toolOverhead(parsing: #"{"bash_20990101": 300, "tool_choice": 400}"#))
        let newer = #"{"tools":[{"type":"bash_20990101"}]}"#
        let held = CostBound(
            bodyBytes: newer.utf8.count, shape: try Self.shape(newer), maxTokens: 64, overheadTokens: 1_000, imageTokens: 5_000,
            largeWindow: false, toolOverhead: settings)
        #expect(held.prompt == .tokens(Int64(newer.utf8.count + 1_000 + 400 + 300)) && held.unknownTool == nil)
        #expect(settings["text_editor_20250728"] == 700)
        for bad in [#"[]"#, #"{"bash": -1}"#, #"{"bash": 1.5}"#, #"{"bash": "245"}"#, #"{"": 1}"#, #"{"a":1,"a":2}"#, "nope"] {
            #expect(CostSettings.toolOverhead(parsing: bad) == nil, "\(bad)")
        }
    }

    @Test("server tools: mcp_servers; a batch's requests")
    func serverTools() throws {
        #expect(!(try Self.shape(#"{"mcp_servers":[]}"#)).bounded)
        #expect(!(try Self.shape(#"{"requests":[{"custom_id":"a","params":{}}]}"#)).bounded)
        // Only the top-level tools list names tools: a tool_use block in a message is content.
        #expect(try Self.shape(#"{"messages":[{"content":[{"type":"server_tool_use","name":"web_search"}]}]}"#).bounded)
        #expect(CostBound.enablesLargeWindow(["x-y", "token-efficient, context-1m-2025-08-07"]))
        #expect(!CostBound.enablesLargeWindow(["context-management-2025"]))
    }

    @Test("a premium-priced mode cannot be bounded: top-level speed other than standard, inference_geo other than global")
    func premiumModes() throws {
        for body in [
            #"{"speed":"fast"}"#, #"{"spe\u0065d":"fast"}"#, #"{"speed":null}"#, #"{"speed":1}"#,
            #"{"inference_geo":"us"}"#, #"{"model":"m","inference_geo":"eu","messages":[]}"#,
        ] {
            let shape = try Self.shape(body)
            #expect(shape.premium && !shape.bounded, "\(body)")
        }
        for body in [
            #"{"speed":"standard","inference_geo":"global"}"#, #"{"model":"m"}"#,
            // Only the top-level members are the call's mode.
            #"{"metadata":{"speed":"fast"},"messages":[{"role":"user","content":[{"type":"text","text":"x","inference_geo":"us"}]}]}"#,
        ] {
            #expect(try Self.shape(body).bounded, "\(body)")
        }
    }
}
