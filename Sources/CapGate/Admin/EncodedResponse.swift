import Foundation
import Hummingbird
import NIOCore

/// A JSON response from a model's `Encodable` conformance (the reads that are not on the call
/// path; the proxy's own bodies and headers stay hand-written in ``JSON`` for speed).
///
/// Keys are sorted, so an answer is the same bytes for the same data; `/` is not escaped.
/// Models write every field, `null` included, in their own `encode(to:)`: the SPEC shows an
/// unlimited cap as `null`, never as a missing key.
func jsonResponse(encoding value: some Encodable, status: HTTPResponse.Status = .ok, headers: HTTPFields = [:]) throws -> Response {
    var headers = headers
    headers[.contentType] = "application/json"
    return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: try wireJSON(value))))
}

/// The JSON text of `value` as ``jsonResponse(encoding:status:headers:)`` sends it.
func wireJSON(_ value: some Encodable) throws -> Data {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return try encoder.encode(value)
}

/// A list in the Anthropic style, as ``listJSON(_:hasMore:nextCursor:)`` writes it:
/// `{"data": [...], "has_more": …, "next_cursor": … or null}`.
struct ListPage<Item: Encodable>: Encodable {
    var data: [Item]
    var hasMore = false
    var nextCursor: String? = nil

    init(_ data: [Item], hasMore: Bool = false, nextCursor: String? = nil) {
        self.data = data
        self.hasMore = hasMore
        self.nextCursor = nextCursor
    }

    enum CodingKeys: String, CodingKey {
        case data, hasMore = "has_more", nextCursor = "next_cursor"
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(data, forKey: .data)
        try c.encode(hasMore, forKey: .hasMore)
        try c.encode(nextCursor, forKey: .nextCursor)
    }
}
