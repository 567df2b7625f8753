import HTTPTypes
import Hummingbird

extension CallReader {
    /// Refuses, from the head alone and before a byte of the body is read, what the provider
    /// would read differently from CapGate (SPEC §2, in the order 405, 415): `TRACE` (its
    /// echo would show the provider key) and `CONNECT` on any path, and a request body in any
    /// `Content-Encoding` but `identity` (CapGate would count compressed bytes the provider reads
    /// decompressed).
    static func checkHead(_ request: Request) throws {
        if request.method == .trace || request.method == .connect {
            throw methodRefusal(request.method)
        }
        for value in request.headers[values: .contentEncoding] {
            for coding in value.split(separator: ",") where !coding.trimmingSpaces.isEmpty {
                guard coding.trimmingSpaces.lowercased() == "identity" else {
                    throw GatewayError(
                        .unsupportedMediaType, "invalid_request_error",
                        "Content-Encoding '\(coding.trimmingSpaces.prefix(40))' is not accepted: send the request body uncompressed."
                    )
                }
            }
        }
    }

    /// Readers disagree on which of several Content-Type fields counts (the first, the last, both
    /// joined): one decides whether CapGate reads the body, so it must be one. A 400, so checked
    /// after the head's 405 and 415 and the body's 413 (SPEC §2's order).
    static func checkContentType(_ request: Request) throws {
        if request.headers[values: .contentType].count > 1 {
            throw GatewayError.invalidRequest("The request has more than one Content-Type field; send one.")
        }
    }

    /// The 405 of `TRACE` and `CONNECT`, with the methods a forwarded path takes in `Allow`.
    static func methodRefusal(_ method: HTTPRequest.Method) -> GatewayError {
        GatewayError(
            .methodNotAllowed, "invalid_request_error", "\(method.rawValue) is not allowed through the gateway.",
            headers: [.allow: "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"])
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (optional whitespace in a field list).
    var trimmingSpaces: Substring {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text.removeFirst() }
        while let last = text.last, last == " " || last == "\t" { text.removeLast() }
        return text
    }
}
