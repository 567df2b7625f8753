import CapGate
import CapGateDev
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization

/// A webhook receiver on loopback for the notification tests: records every POST with its
/// Standard Webhooks headers, checks the signature with the shared secret, and answers the
/// status it is told to. Started and stopped on a fixed port, so it can be "down" (connection
/// refused) and come back where the gateway expects it.
final class WebhookReceiver: Sendable {
    struct Delivery: Sendable {
        var id: String
        var timestamp: Int
        var signature: String
        var body: String
        var validSignature: Bool
        var json: JSON { (try? JSON.parse(Array(body.utf8))) ?? .null }
    }

    let port: Int
    let secret: String
    private let state = Mutex<(answer: Int, deliveries: [Delivery], attempts: Int)>((200, [], 0))
    /// When set, a 2xx answer's body is sent one byte per `every`, for `total` (a receiver that
    /// drips its answer).
    private let dripping = Mutex<(every: Duration, total: Duration)?>(nil)
    private let running = Mutex<(group: ServiceGroup, task: Task<Void, any Error>)?>(nil)

    init(port: Int, secret: String) {
        self.port = port
        self.secret = secret
    }

    var url: String { "http://127.0.0.1:\(port)/hooks/capgate" }
    var deliveries: [Delivery] { state.withLock { $0.deliveries } }
    /// Every POST received, whatever was answered.
    var attempts: Int { state.withLock { $0.attempts } }

    /// The status later POSTs get (their deliveries are recorded only when it is 2xx).
    func answer(_ status: Int) { state.withLock { $0.answer = status } }

    /// Later 2xx answers drip their body: one byte per `every` for `total`.
    func drip(every: Duration, total: Duration) { dripping.withLock { $0 = (every, total) } }

    func start() async throws {
        let router = Router()
        let secret = self.secret
        router.post("/hooks/capgate") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1 << 20)
            let id = request.headers[.init("webhook-id")!] ?? ""
            let timestamp = Int(request.headers[.init("webhook-timestamp")!] ?? "") ?? 0
            let signature = request.headers[.init("webhook-signature")!] ?? ""
            let valid = WebhookSignature.verify(
                id: id, timestamp: timestamp, body: Array(body.readableBytesView), secret: secret, header: signature)
            let status = self.state.withLock { s -> Int in
                s.attempts += 1
                if (200..<300).contains(s.answer) {
                    s.deliveries.append(
                        Delivery(id: id, timestamp: timestamp, signature: signature, body: String(buffer: body), validSignature: valid))
                }
                return s.answer
            }
            if (200..<300).contains(status), let (every, total) = self.dripping.withLock({ $0 }) {
                return Response(
                    status: .init(code: status),
                    body: ResponseBody { writer in
                        let end = ContinuousClock.now + total
                        while ContinuousClock.now < end {
                            try await writer.write(ByteBuffer(string: "."))
                            try await Task.sleep(for: every)
                        }
                        try await writer.finish(nil)
                    })
            }
            return Response(status: .init(code: status))
        }
        let (ready, continuation) = AsyncStream.makeStream(of: Void.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: nil),
            onServerRunning: { _ in continuation.yield() }, logger: Logger(label: "webhook-receiver"))
        let group = Harness.serviceGroup([app], logger: Logger(label: "webhook-receiver"))
        let task = Task {
            defer { continuation.finish() }
            try await group.run()
        }
        running.withLock { $0 = (group, task) }
        var iterator = ready.makeAsyncIterator()
        _ = await iterator.next()
    }

    func stop() async {
        guard
            let current = running.withLock({ r in
                defer { r = nil }; return r
            })
        else { return }
        await current.group.triggerGracefulShutdown()
        _ = try? await current.task.value
    }

    /// A port nothing listens on now, outside the kernel's ephemeral range.
    static func freePort() throws -> Int { try EmbeddedPostgres.freePort() }
}
