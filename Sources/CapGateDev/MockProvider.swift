import CapGate
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// A small stand-in for the Anthropic Messages API, used by `capgate dev` when no upstream is
/// configured and by the tests. It answers on loopback only.
///
/// - `POST /v1/messages`: a message (JSON) or, with `"stream": true`, the SSE event sequence
///   (`message_start` … `message_stop`) with `usage` in `message_start` and `message_delta`.
/// - `GET /v1/models`: a model list; `POST /v1/messages/count_tokens`: `{"input_tokens": 7}`. Any other path: a JSON echo of method, path, query and the
///   header names received (so tests can see which credentials reached the provider).
/// - Test controls, as request headers (or as the `model` name, so an SDK can steer them):
///   `x-mock-status: 500` (or model `mock-error-500`), `x-mock-delay-ms: N` before the head
///   (model `mock-stall`: 30 s), `x-mock-chunk-delay-ms: N` between SSE events,
///   `x-mock-bytes: N` for an N-byte body; the usage it reports: see ``MockUsage``.
public struct MockProvider: Sendable {
    /// Requests received, for tests that check nothing was forwarded.
    public let counter = RequestCounter()
    /// Requests answered 2xx: what a gateway in front must have charged (the ledger invariant).
    public let served = RequestCounter()

    public init() {}

    /// Counts requests in a thread-safe way.
    public final class RequestCounter: Sendable {
        let value = Mutex(0)
        public init() {}
        public var count: Int { value.withLock { $0 } }
        /// Counts one request; returns the new count.
        @discardableResult
        func increment() -> Int {
            value.withLock {
                $0 += 1; return $0
            }
        }
    }

    public func buildApplication(
        host: String = "127.0.0.1", port: Int = 0, logger: Logger,
        onServerRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
    ) -> some ApplicationProtocol {
        let router = Router()
        let counter = self.counter
        let served = self.served
        router.get("/v1/models") { _, _ -> Response in
            counter.increment()
            served.increment()
            return Self.json(Self.models)
        }
        router.post("/v1/messages/count_tokens") { request, _ -> Response in
            counter.increment()
            served.increment()
            _ = try await request.body.collect(upTo: 64 << 20)
            return Self.json(.obj(["input_tokens": 7]))
        }
        router.get("/__mock/requests") { _, _ -> Response in
            Self.json(.obj(["count": .int(Int64(counter.count))]))
        }
        router.post("/v1/messages") { request, _ -> Response in
            try await Self.messages(request, counter: counter, served: served)
        }
        // Everything else: an echo.
        // (The router does not backtrack from /v1/… to a root wildcard, so both are registered.)
        for method in [HTTPRequest.Method.get, .post, .put, .patch, .delete] {
            for path in ["/**", "/v1/**"] {
                router.on(RouterPath(path), method: method) { request, context -> Response in
                    counter.increment()
                    served.increment()
                    _ = try await request.body.collect(upTo: 64 << 20)
                    let names = request.headers.map { JSON.string($0.name.canonicalName) }
                    let apiKey = request.headers[HTTPField.Name("x-api-key")!]
                    return Self.json(
                        .obj([
                            "method": .string(request.method.rawValue), "path": .string(request.uri.path),
                            "query": JSON(request.uri.query), "header_names": .array(names),
                            "x_api_key": JSON(apiKey),
                            "authorization": JSON(request.headers[.authorization]),
                            "usage": .obj(["input_tokens": 3, "output_tokens": 4]),
                        ])
                    )
                }
            }
        }
        return Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: nil),
            onServerRunning: onServerRunning,
            logger: logger
        )
    }

    /// `POST /v1/messages`: an answer (whole or streamed) with usage counted from the request, or
    /// the failure, delay or size the request's mock fields ask for.
    static func messages(_ request: Request, counter: RequestCounter, served: RequestCounter) async throws -> Response {
        let number = counter.increment()
        let body = try await request.body.collect(upTo: 64 << 20)
        // Only the two fields it needs are read, and ids come from the request counter.
        let json = JSON.topLevelValues(["model", "stream"], in: body)
        let model = json["model"]?.stringValue ?? "claude-mock-1"
        let headers = request.headers
        var status = headers[Self.statusField].flatMap(Int.init) ?? 200
        var delay = headers[Self.delayField].flatMap(Int.init) ?? 0
        if model == "mock-error-500" { status = 500 }
        if model == "mock-stall" { delay = 30_000 }
        if delay > 0 { try await Task.sleep(for: .milliseconds(delay)) }
        if status >= 400 {
            return Self.json(
                .obj(["type": "error", "error": .obj(["type": "api_error", "message": "mock provider failure"])]),
                status: .init(code: status)
            )
        }
        served.increment()
        let usage = MockUsage(body: body, headers: headers)
        if let bytes = headers[Self.bytesField].flatMap(Int.init) {
            return Self.bulk(bytes: bytes)
        }
        if json["stream"]?.boolValue == true {
            let chunkDelay = headers[Self.chunkDelayField].flatMap(Int.init) ?? 0
            return Self.stream(Self.streamEvents(model: model, usage: usage), chunkDelay: chunkDelay)
        }
        return Self.json(Self.message(id: "msg_mock_" + String(number, radix: 16), model: model, usage: usage))
    }

    static func json(_ value: JSON, status: HTTPResponse.Status = .ok) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[requestIDField] = "mock_req"
        return Response(status: status, headers: headers, body: .init(byteBuffer: value.byteBuffer()))
    }

    static let requestIDField = HTTPField.Name("request-id")!
    static let statusField = HTTPField.Name("x-mock-status")!
    static let delayField = HTTPField.Name("x-mock-delay-ms")!
    static let bytesField = HTTPField.Name("x-mock-bytes")!
    static let chunkDelayField = HTTPField.Name("x-mock-chunk-delay-ms")!

    /// The answer text, and its token count.
    static let text = "Hello from the mock provider."
    static let outputTokens: Int64 = 7

    static let models = JSON.obj([
        "data": .array([.obj(["type": "model", "id": "claude-mock-1", "display_name": "Mock"])]), "has_more": false,
    ])

    /// A Messages API answer.
    static func message(id: String, model: String, usage: MockUsage) -> JSON {
        .obj([
            "id": .string(id), "type": "message", "role": "assistant",
            "model": .string(model), "content": .array([.obj(["type": "text", "text": .string(text)])]),
            "stop_reason": "end_turn", "stop_sequence": .null,
            "usage": usage.json(),
        ])
    }

    /// The same answer as server-sent events: name and data of each.
    static func streamEvents(model: String, usage: MockUsage) -> [(event: String, data: JSON)] {
        var events: [(event: String, data: JSON)] = [
            (
                "message_start",
                .obj([
                    "type": "message_start",
                    "message": .obj([
                        "id": "msg_mock_stream", "type": "message", "role": "assistant", "model": .string(model),
                        "content": .array([]), "stop_reason": .null, "stop_sequence": .null,
                        "usage": usage.json(output: 1),
                    ]),
                ])
            ),
            (
                "content_block_start",
                .obj(["type": "content_block_start", "index": 0, "content_block": .obj(["type": "text", "text": ""])])
            ),
        ]
        for word in text.split(separator: " ") {
            events.append(
                (
                    "content_block_delta",
                    .obj([
                        "type": "content_block_delta", "index": 0, "delta": .obj(["type": "text_delta", "text": .string(word + " ")]),
                    ])
                ))
        }
        events.append(("content_block_stop", .obj(["type": "content_block_stop", "index": 0])))
        events.append(
            (
                "message_delta",
                .obj([
                    "type": "message_delta", "delta": .obj(["stop_reason": "end_turn", "stop_sequence": .null]),
                    "usage": usage.verbatim ?? .obj(["output_tokens": .int(usage.output)]),
                ])
            ))
        events.append(("message_stop", .obj(["type": "message_stop"])))
        return events
    }

    static func stream(_ events: [(event: String, data: JSON)], chunkDelay: Int) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/event-stream"
        headers[.cacheControl] = "no-cache"
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody { writer in
                for (event, data) in events {
                    try await writer.write(ByteBuffer(string: "event: \(event)\ndata: \(data.serialized())\n\n"))
                    if chunkDelay > 0 { try await Task.sleep(for: .milliseconds(chunkDelay)) }
                }
                try await writer.finish(nil)
            }
        )
    }

    static func bulk(bytes: Int) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "application/octet-stream"
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody(contentLength: bytes) { writer in
                let chunk = ByteBuffer(repeating: UInt8(ascii: "x"), count: 64 * 1024)
                var left = bytes
                while left > 0 {
                    let n = min(left, chunk.readableBytes)
                    try await writer.write(chunk.getSlice(at: 0, length: n)!)
                    left -= n
                }
                try await writer.finish(nil)
            }
        )
    }
}
