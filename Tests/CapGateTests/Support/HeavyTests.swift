/// Tests that load the whole process (thousands of connections, a 100 MB stream) or measure it
/// (its resident memory) take turns: Swift Testing runs suites in parallel, and the memory test
/// measures the process, so the 3,000-connection test beside it would be counted as its growth.
actor HeavyTests {
    static let turn = HeavyTests()
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    /// Runs `body` when no other heavy test runs.
    static func alone<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        await turn.acquire()
        do {
            let value = try await body()
            await turn.release()
            return value
        } catch {
            await turn.release()
            throw error
        }
    }

    private func acquire() async {
        guard busy else {
            busy = true
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    private func release() {
        if waiting.isEmpty { busy = false } else { waiting.removeFirst().resume() }
    }
}
