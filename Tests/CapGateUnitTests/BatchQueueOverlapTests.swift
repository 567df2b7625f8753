import Synchronization
import Testing

@testable import CapGate

/// A ``BatchQueue`` that overlaps at the answer (the admission queue): the next batch starts once
/// the current one released, never two before their release, callers answered when their batch ends.
@Suite("Batch queue overlapping at the answer", .timeLimit(.minutes(1)))
struct BatchQueueOverlapTests {
    /// Gates a test opens, batches started and ended, and how many batches are before their
    /// release at once (an atomic count, its highest value kept).
    final class Probe: Sendable {
        let open = Mutex<Set<String>>([])
        let started = Mutex<[[Int]]>([])
        let ended = Mutex<[[Int]]>([])
        let beforeRelease = Atomic(0)
        let mostBeforeRelease = Atomic(0)

        func openGate(_ name: String) { open.withLock { _ = $0.insert(name) } }

        func pass(_ name: String) async {
            while !open.withLock({ $0.contains(name) }) { try? await Task.sleep(for: .milliseconds(2)) }
        }

        func start(_ items: [Int]) {
            started.withLock { $0.append(items) }
            let now = beforeRelease.wrappingAdd(1, ordering: .sequentiallyConsistent).newValue
            mostBeforeRelease.max(now, ordering: .sequentiallyConsistent)
        }

        func release(_ release: BatchRelease) {
            beforeRelease.wrappingSubtract(1, ordering: .sequentiallyConsistent)
            release()
        }

        func end(_ items: [Int]) -> [Result<Int, any Error>] {
            ended.withLock { $0.append(items) }
            return items.map { .success($0 * 10) }
        }

        var starts: [[Int]] { started.withLock { $0 } }
        var ends: [[Int]] { ended.withLock { $0 } }

        /// Waits until `items` started as a batch (or gives up after a second).
        func waitForStart(of items: [Int]) async {
            for _ in 0..<500 where !starts.contains(items) { try? await Task.sleep(for: .milliseconds(2)) }
        }
    }

    /// A batch named by its first item: gate "answer N" before its release, "end N" after it.
    static func gated(_ probe: Probe) -> BatchQueue<Int, Int>.ReleasingProcess {
        { items, release in
            probe.start(items)
            await probe.pass("answer \(items[0])")
            probe.release(release)
            await probe.pass("end \(items[0])")
            return probe.end(items)
        }
    }

    /// Submits `items` one after the other (each from a task of its own), so they queue in order.
    static func submitAll(_ queue: BatchQueue<Int, Int>, _ items: ClosedRange<Int>) async -> [Task<Int, any Error>] {
        var tasks: [Task<Int, any Error>] = []
        for item in items {
            tasks.append(Task { try await queue.submit(item) })
            try? await Task.sleep(for: .milliseconds(5))
        }
        return tasks
    }

    @Test("the caller's own batch hands the queue to a drain at its release; the next batch ends before it; a later submit leads")
    func inlineHandsOver() async throws {
        let probe = Probe()
        let queue = BatchQueue<Int, Int>(maxBatch: 10, overlapsAtAnswer: true, process: Self.gated(probe))
        let first = Task { try await queue.submit(0) }
        await probe.waitForStart(of: [0])
        let queued = await Self.submitAll(queue, 1...3)
        try await Task.sleep(for: .milliseconds(30))
        #expect(probe.starts == [[0]], "a batch started before the first one's release")

        probe.openGate("answer 0")
        await probe.waitForStart(of: [1, 2, 3])
        #expect(probe.starts == [[0], [1, 2, 3]] && probe.ends.isEmpty)
        probe.openGate("answer 1")
        probe.openGate("end 1")
        for (index, task) in queued.enumerated() { #expect(try await task.value == (index + 1) * 10) }
        #expect(probe.ends == [[1, 2, 3]], "the first batch ended before its caller was answered")

        // Idle again (nothing before its release): the next caller leads, the first batch still open.
        probe.openGate("answer 4")
        probe.openGate("end 4")
        #expect(try await queue.submit(4) == 40)
        probe.openGate("end 0")
        #expect(try await first.value == 0)
        #expect(probe.mostBeforeRelease.load(ordering: .sequentiallyConsistent) == 1)
        #expect(queue.statistics.batches == 3 && queue.statistics.items == 5 && queue.statistics.largest == 3)
    }

    @Test("a drained batch hands over to a new drain at its release; never two batches before their release")
    func drainHandsOver() async throws {
        let probe = Probe()
        let queue = BatchQueue<Int, Int>(maxBatch: 2, overlapsAtAnswer: true, process: Self.gated(probe))
        let first = Task { try await queue.submit(0) }
        await probe.waitForStart(of: [0])
        let second = await Self.submitAll(queue, 1...2)
        try await Task.sleep(for: .milliseconds(20))
        let third = await Self.submitAll(queue, 3...4)
        try await Task.sleep(for: .milliseconds(20))
        probe.openGate("answer 0")
        await probe.waitForStart(of: [1, 2])
        try await Task.sleep(for: .milliseconds(20))
        #expect(probe.starts.count == 2, "a batch started before [1, 2] released")

        probe.openGate("answer 1")
        await probe.waitForStart(of: [3, 4])
        probe.openGate("answer 3")
        probe.openGate("end 3")
        for (index, task) in third.enumerated() { #expect(try await task.value == (index + 3) * 10) }
        #expect(probe.ends == [[3, 4]])
        probe.openGate("end 1")
        for (index, task) in second.enumerated() { #expect(try await task.value == (index + 1) * 10) }
        probe.openGate("end 0")
        #expect(try await first.value == 0)
        #expect(probe.starts == [[0], [1, 2], [3, 4]])
        #expect(probe.mostBeforeRelease.load(ordering: .sequentiallyConsistent) == 1)
        // The drain whose batch released earlier took nothing more when it ended.
        #expect(queue.statistics.batches == 3 && queue.statistics.waiting == 0)
    }

    @Test("a batch that never releases lets the next start when it ends; without overlap a release changes nothing")
    func endReleases() async throws {
        for overlaps in [true, false] {
            let probe = Probe()
            let queue = BatchQueue<Int, Int>(maxBatch: 10, overlapsAtAnswer: overlaps) { items, release in
                probe.start(items)
                if overlaps == false { release() }
                await probe.pass("end \(items[0])")
                return probe.end(items)
            }
            let first = Task { try await queue.submit(0) }
            await probe.waitForStart(of: [0])
            let queued = await Self.submitAll(queue, 1...2)
            try await Task.sleep(for: .milliseconds(40))
            #expect(probe.starts == [[0]], "overlaps: \(overlaps)")
            probe.openGate("end 0")
            #expect(try await first.value == 0)
            await probe.waitForStart(of: [1, 2])
            probe.openGate("end 1")
            for (index, task) in queued.enumerated() { #expect(try await task.value == (index + 1) * 10) }
            #expect(probe.starts == [[0], [1, 2]] && probe.ends == [[0], [1, 2]])
        }
    }

    @Test("wait limits, queueLimit and late delivery still hold: a queued item gives up, a released one's result goes to late")
    func boundedWaits() async throws {
        let probe = Probe()
        let lateResults = Mutex<[Int: Int]>([:])
        let queue = BatchQueue<Int, Int>(
            maxBatch: 10, waitLimit: .milliseconds(150), queueLimit: 1,
            late: { item, result in lateResults.withLock { $0[item] = try? result.get() } },
            overlapsAtAnswer: true, process: Self.gated(probe))
        let first = Task { try await queue.submit(0) }
        await probe.waitForStart(of: [0])
        // Queued behind a batch before its release, past its wait limit: given up, never processed.
        let gaveUp = Task { try await queue.submit(1) }
        try await Task.sleep(for: .milliseconds(20))
        await #expect(throws: BatchQueueRejection.queueFull) { try await queue.submit(9) }
        await #expect(throws: BatchQueueRejection.waitedTooLong) { try await gaveUp.value }

        // Taken into a batch that answered but outlasts its caller's wait limit: its result goes to late.
        let taken = Task { try await queue.submit(2) }
        try await Task.sleep(for: .milliseconds(20))
        probe.openGate("answer 0")
        await probe.waitForStart(of: [2])
        probe.openGate("answer 2")
        await #expect(throws: BatchQueueRejection.waitedTooLong) { try await taken.value }
        probe.openGate("end 2")
        for _ in 0..<200 where lateResults.withLock({ $0.isEmpty }) { try await Task.sleep(for: .milliseconds(2)) }
        #expect(lateResults.withLock { $0 } == [2: 20])
        probe.openGate("end 0")
        #expect(try await first.value == 0)
        #expect(probe.starts == [[0], [2]])
        let statistics = queue.statistics
        #expect(statistics.expired == 2 && statistics.rejected == 1 && statistics.waiting == 0)
    }
}
