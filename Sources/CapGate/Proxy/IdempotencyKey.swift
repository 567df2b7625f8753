import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

/// The `Idempotency-Key` rules of SPEC §2 at the HTTP edge: the header's form, the request
/// fingerprint the key is bound to, the answers to a retry, and the answer kept for retries.
/// The decisions themselves are made in the admission transaction (`capgate_admit_idempotent`).
enum IdempotencyKey {
    /// The longest key accepted (SPEC §2).
    static let maxLength = 255

    /// The header's key, nil when absent or empty; 400 when longer than 255 characters or when it
    /// holds a control character (a key is an opaque printable token: UUIDs, ULIDs, hashes).
    static func key(in headers: HTTPFields) throws -> String? {
        guard let value = headers[.idempotencyKey], !value.isEmpty else { return nil }
        guard value.count <= maxLength else {
            throw GatewayError.invalidRequest("The Idempotency-Key header is longer than \(maxLength) characters.")
        }
        guard !value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw GatewayError.invalidRequest("The Idempotency-Key header may not contain control characters.")
        }
        return value
    }

    /// SHA-256 of the method, the request target (path and query, as sent) and the body's
    /// SHA-256: another method, path, query or body under the same key is another request.
    static func fingerprint(method: String, target: String, body: ByteBuffer) -> ByteBuffer {
        let bodyDigest = SHA256.hash(data: body.readableBytesView)
        var hasher = SHA256()
        hasher.update(data: Data(method.utf8))
        hasher.update(data: [0])
        hasher.update(data: Data(target.utf8))
        hasher.update(data: [0])
        hasher.update(data: Array(bodyDigest))
        return ByteBuffer(bytes: hasher.finalize())
    }

    /// The answer to a call whose key refused it: 409 (in flight, or its answer was not kept) or
    /// 422 (the key was used for another request). Nothing was forwarded or charged.
    static func refusal(_ decision: Admission.Decision, maxKeptBytes: Int) -> GatewayError? {
        switch decision {
        case .idempotencyInFlight:
            var headers = HTTPFields()
            headers[.retryAfter] = "1"
            return GatewayError(
                .conflict, "idempotency_conflict",
                "A request with this Idempotency-Key is still in progress. Retry after it has finished.", headers: headers)
        case .idempotencyNotKept:
            return GatewayError(
                .conflict, "idempotency_conflict",
                "A request with this Idempotency-Key already succeeded, but its answer was larger than \(maxKeptBytes) bytes and was not kept, so it cannot be returned again. Send a new Idempotency-Key to make a new request."
            )
        case .idempotencyMismatch:
            return GatewayError(
                .init(code: 422), "idempotency_key_reused",
                "This Idempotency-Key was already used for a different request (method, path, query or body). Use a new key for a new request."
            )
        default:
            return nil
        }
    }

    /// The kept answer of the attempt that succeeded, returned as it was: status, content type
    /// and body, marked `Idempotent-Replayed: true`.
    static func replay(_ answer: StoredAnswer) -> Response {
        var headers = HTTPFields()
        if let type = answer.contentType, let field = HTTPField.Name("content-type") {
            headers[field] = type
        }
        headers[.idempotentReplayed] = "true"
        return Response(status: .init(code: answer.status), headers: headers, body: ResponseBody(byteBuffer: answer.body))
    }
}

/// The bytes of an answer as they go to the client, kept up to a limit for retries with the
/// same `Idempotency-Key`; past the limit it keeps nothing.
struct AnswerRecorder: Sendable {
    let limit: Int
    private(set) var bytes: ByteBuffer? = ByteBuffer()

    init(limit: Int) {
        self.limit = limit
    }

    mutating func record(_ chunk: ByteBuffer) {
        guard var kept = bytes else { return }
        guard kept.readableBytes + chunk.readableBytes <= limit else {
            bytes = nil
            return
        }
        bytes = nil
        var chunk = chunk
        kept.writeBuffer(&chunk)
        bytes = kept
    }
}

extension HTTPField.Name {
    static let idempotentReplayed = Self("Idempotent-Replayed")!
}

/// Keeps the answer of a call with an `Idempotency-Key` that succeeded. A database that cannot
/// be reached delays it (it waits in the spool, like a refund); until it is kept, retries get
/// 409 (in flight).
struct AnswerKeeper: Sendable {
    let metering: MeteringStore
    let user: UserIdentity
    let key: String
    let requestID: String
    let logger: Logger

    func keep(status: Int, contentType: String?, body: ByteBuffer?) async {
        do {
            try await metering.keepAnswer(
                companyID: user.companyID, userID: user.userID, key: key, requestID: requestID, status: status,
                contentType: contentType, body: body)
        } catch DatabaseError.unavailable {
            logger.warning("idempotent answer not kept yet: the database is unavailable; it waits in the spool")
            metering.pendingWrites.later(
                .answer(
                    company: user.companyID, user: user.userID, key: key, requestID: requestID, status: status,
                    contentType: contentType, body: body.map { Data($0.readableBytesView) }))
        } catch {
            logger.error("idempotent answer could not be kept; retries of its key get 409 until it expires")
        }
    }
}
