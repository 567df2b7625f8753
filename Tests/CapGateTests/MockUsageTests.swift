import Foundation
import HTTPTypes
import NIOCore
import Testing

@testable import CapGate
@testable import CapGateDev

/// The mock provider's usage (SPEC §11: realistic enough to try budgets with), and the prompt
/// bound never below what it bills for text and images.
@Suite("Mock provider usage", .timeLimit(.minutes(2)))
struct MockUsageTests {
    static func body(text: Int, images: Int, cache: String? = nil, maxTokens: Int = 64) -> String {
        let control = cache.map { #","cache_control":{"type":"ephemeral"\#($0 == "1h" ? #","ttl":"1h""# : "")}"# } ?? ""
        let blocks =
            (0..<images).map { _ in #"{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}"# }
            + [#"{"type":"text","text":"\#(String(repeating: "é", count: text))"\#(control)}"#]
        return #"{"model":"m","max_tokens":\#(maxTokens),"messages":[{"role":"user","content":[\#(blocks.joined(separator: ","))]}]}"#
    }

    @Test("over HTTP: input from the body, output up to max_tokens, cache fields when asked, a verbatim usage on request")
    func overHTTP() async throws {
        try await Harness.with { h in
            func usage(_ body: String, _ headers: [(String, String)] = []) async throws -> JSON? {
                let reply = try await h.request(.POST, "/v1/messages", headers: headers, body: body, base: h.mockURL)
                return reply.json["usage"]
            }
            let plain = try #require(try await usage(Self.body(text: 100, images: 2, maxTokens: 3), [("x-mock-output-tokens", "50")]))
            #expect(plain["output_tokens"]?.intValue == 3)
            #expect((plain["input_tokens"]?.intValue ?? 0) >= 2 * MockUsage.imageTokens)
            #expect(plain["cache_creation_input_tokens"] == nil)
            let cached = try #require(try await usage(Self.body(text: 100, images: 0, cache: "1h"), [("x-mock-cache-read", "9")]))
            #expect((cached["cache_creation"]?["ephemeral_1h_input_tokens"]?.intValue ?? 0) > 0)
            #expect(cached["cache_creation"]?["ephemeral_5m_input_tokens"]?.intValue == 0)
            #expect(cached["cache_read_input_tokens"]?.intValue == 9)
            let verbatim = try await usage(Self.body(text: 1, images: 0), [("x-mock-usage", #"{"input_tokens":999999,"output_tokens":1}"#)])
            #expect(verbatim?["input_tokens"]?.intValue == 999_999)
        }
    }

    @Test("the prompt bound is never below what the mock bills as prompt, for text, images and cache writes")
    func boundHolds() throws {
        for text in [0, 1, 10, 1_000, 50_000] {
            for images in [0, 1, 3] {
                for cache in [nil, "5m", "1h"] {
                    let body = ByteBuffer(string: Self.body(text: text, images: images, cache: cache))
                    let usage = MockUsage(body: body, headers: [:])
                    let reading = try CallBody.read(body, contentType: "application/json", maxDepth: 128)
                    let prompt = CostBound(
                        bodyBytes: body.readableBytes, shape: try reading.promptShape(), maxTokens: 64, overheadTokens: 1_000,
                        imageTokens: 5_000, largeWindow: false
                    ).prompt
                    guard case .tokens(let bound) = prompt else {
                        Issue.record("text \(text), images \(images): bounded as \(prompt)")
                        continue
                    }
                    let billed = usage.input + usage.cacheWrite5m + usage.cacheWrite1h
                    #expect(bound >= billed, "text \(text), images \(images), cache \(cache ?? "none"): bound \(bound) < \(billed)")
                    #expect(try reading.promptShape().cachedLong == (cache == "1h"))
                }
            }
        }
    }
}
