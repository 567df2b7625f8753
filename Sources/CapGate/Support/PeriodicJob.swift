import ServiceLifecycle

/// A background job of `capgate serve` that runs `work` at once and then every `interval` until
/// the graceful shutdown; `work` handles and logs its own failures (the next round retries).
/// It never touches the request path.
struct PeriodicJob: Service {
    let interval: Duration
    let work: @Sendable () async -> Void

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            await work()
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: interval) }
        }
    }
}
