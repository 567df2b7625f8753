import Hummingbird
import NIOCore

/// Every error CapGate answers with, rendered in the Anthropic error envelope
/// `{"type":"error","error":{"type":…,"message":…}}` (plus `usage` where it applies) so that SDKs
/// surface it as an API error with a readable message.
public struct GatewayError: Error, HTTPResponseError, Sendable {
    public var status: HTTPResponse.Status
    /// The SPEC's `error.type`.
    public var type: String
    /// A sentence a person can act on. Never contains secrets or prompt content.
    public var message: String
    /// The `usage` object, for 402 answers.
    public var usage: JSON?
    /// Extra headers (for example RateLimit fields on a 402).
    public var headers: HTTPFields

    public init(_ status: HTTPResponse.Status, _ type: String, _ message: String, usage: JSON? = nil, headers: HTTPFields = [:]) {
        self.status = status
        self.type = type
        self.message = message
        self.usage = usage
        self.headers = headers
    }

    public var body: JSON {
        var fields: [JSON.Field] = [
            .init("type", "error"),
            .init("error", .obj(["type": .string(type), "message": .string(message)])),
        ]
        if let usage { fields.append(.init("usage", usage)) }
        return .object(fields)
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        makeResponse()
    }

    public func makeResponse() -> Response {
        var headers = self.headers
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: body.byteBuffer()))
    }

    public static func invalidRequest(_ message: String) -> GatewayError {
        GatewayError(.badRequest, "invalid_request_error", message)
    }
    public static func authentication(_ message: String) -> GatewayError {
        GatewayError(.unauthorized, "authentication_error", message)
    }
    public static func permission(_ message: String = "This credential is not allowed to use this resource.") -> GatewayError {
        GatewayError(.forbidden, "permission_error", message)
    }
    public static func notFound(_ message: String) -> GatewayError {
        GatewayError(.notFound, "not_found_error", message)
    }
    public static func conflict(_ message: String) -> GatewayError {
        GatewayError(.conflict, "conflict_error", message)
    }
    public static func tooLarge(limit: Int) -> GatewayError {
        GatewayError(.contentTooLarge, "request_too_large", "The request body is larger than this gateway accepts (\(limit) bytes).")
    }
    public static func overloaded(
        _ message: String = "The usage database is unreachable, so the call was not forwarded. Try again shortly."
    ) -> GatewayError {
        GatewayError(.serviceUnavailable, "overloaded_error", message)
    }
    public static func upstream(_ message: String) -> GatewayError {
        GatewayError(.badGateway, "upstream_error", message)
    }
    public static func upstreamTimeout(_ message: String) -> GatewayError {
        GatewayError(.gatewayTimeout, "upstream_timeout", message)
    }
}
