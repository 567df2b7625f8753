import Synchronization
import Testing

@testable import CapGate

/// Group commit (``BatchQueue``) without a database: batches, order, and bounded waits.
@Suite("Batch queue", .timeLimit(.minutes(1)))
struct BatchQueueTests {
    /// A process step that records its batches and holds each one until released.
    final class Recorder: Sendable {
        let batches = Mutex<[[Int]]>([])
        func record(_ items: [Int]) { batches.withLock { $0.append(items) } }
        var all: [[Int]] { batches.withLock { $0 } }
    }

    @Test("a lone item is processed at once by its caller; items arriving meanwhile go into the next batch, in arrival order")
    func groupCommit() async throws {
        let recorder = Recorder()
        let queue = BatchQueue<Int, Int>(maxBatch: 100) { items in
            recorder.record(items)
            try? await Task.sleep(for: .milliseconds(50))
            return items.map { .success($0 * 10) }
        }
        #expect(try await queue.submit(1) == 10)
        #expect(recorder.all == [[1]])

        let results = try await withThrowingTaskGroup(of: (Int, Int).self) { group in
            group.addTask { (0, try await queue.submit(0)) }
            try await Task.sleep(for: .milliseconds(10))
            for i in 1...20 { group.addTask { (i, try await queue.submit(i)) } }
            return try await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        #expect(results.count == 21 && results.allSatisfy { $0.value == $0.key * 10 })
        let later = Array(recorder.all.dropFirst(2))
        #expect(recorder.all[1] == [0])
        #expect(later.flatMap { $0 }.sorted() == Array(1...20))
        #expect(later.count < 20, "the 20 items that arrived during one batch were not batched: \(later)")
        #expect(queue.statistics.largest > 1)
    }

    @Test("maxBatch bounds a batch; each caller gets its own item's result, failures included")
    func boundsAndResults() async throws {
        let recorder = Recorder()
        let gate = Mutex(true)
        let queue = BatchQueue<Int, Int>(maxBatch: 3) { items in
            recorder.record(items)
            while gate.withLock({ $0 }) && items == [0] { try? await Task.sleep(for: .milliseconds(5)) }
            return items.map { $0 % 2 == 0 ? .success($0) : .failure(Failure.odd) }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { _ = try await queue.submit(0) }
            try await Task.sleep(for: .milliseconds(20))
            for i in 1...7 {
                group.addTask {
                    do {
                        #expect(try await queue.submit(i) == i && i % 2 == 0)
                    } catch {
                        #expect(i % 2 == 1 && error as? Failure == .odd)
                    }
                }
            }
            try await Task.sleep(for: .milliseconds(20))
            gate.withLock { $0 = false }
            try await group.waitForAll()
        }
        #expect(recorder.all.dropFirst().allSatisfy { $0.count <= 3 })
        #expect(recorder.all.flatMap { $0 }.sorted() == Array(0...7))
    }

    @Test("queueLimit refuses at once past it; waitLimit gives up an item still queued")
    func bounded() async throws {
        let gate = Mutex(true)
        let queue = BatchQueue<Int, Int>(maxBatch: 10, waitLimit: .milliseconds(100), queueLimit: 2) { items in
            while gate.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(5)) }
            return items.map { .success($0) }
        }
        let first = Task { try await queue.submit(0) }
        try await Task.sleep(for: .milliseconds(20))
        let waiting = [Task { try await queue.submit(1) }, Task { try await queue.submit(2) }]
        try await Task.sleep(for: .milliseconds(20))
        await #expect(throws: BatchQueueRejection.queueFull) { try await queue.submit(3) }
        for task in waiting {
            await #expect(throws: BatchQueueRejection.waitedTooLong) { try await task.value }
        }
        gate.withLock { $0 = false }
        #expect(try await first.value == 0)
    }

    @Test("waitLimit counts from each item's arrival: items that arrived later give up later, after answered ones")
    func staggeredWaits() async throws {
        let gate = Mutex(true)
        let queue = BatchQueue<Int, Int>(maxBatch: 10, waitLimit: .milliseconds(300)) { items in
            if items != [0] { while gate.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(5)) } }
            return items.map { .success($0) }
        }
        // An item answered at once (its deadline entry is left for the sweep), then one that holds
        // the queue, then two that wait 150 ms apart.
        #expect(try await queue.submit(0) == 0)
        let holder = Task { try await queue.submit(1) }
        try await Task.sleep(for: .milliseconds(20))
        let start = ContinuousClock.now
        let early = Task { try await queue.submit(2) }
        try await Task.sleep(for: .milliseconds(150))
        let late = Task { try await queue.submit(3) }
        await #expect(throws: BatchQueueRejection.waitedTooLong) { try await early.value }
        let earlyGaveUp = ContinuousClock.now - start
        #expect(earlyGaveUp >= .milliseconds(290) && earlyGaveUp < .milliseconds(440))
        #expect(queue.statistics.waiting == 1)
        await #expect(throws: BatchQueueRejection.waitedTooLong) { try await late.value }
        let lateGaveUp = ContinuousClock.now - start
        #expect(lateGaveUp >= .milliseconds(440))
        #expect(queue.statistics.expired == 2)
        gate.withLock { $0 = false }
        #expect(try await holder.value == 1)
    }

    enum Failure: Error { case odd }

    @Test("pace: under a steady stream the next batch starts no sooner than pace after the last one started, with what arrived meanwhile")
    func paced() async throws {
        let starts = Mutex<[ContinuousClock.Instant]>([])
        let recorder = Recorder()
        let queue = BatchQueue<Int, Void>(maxBatch: 1000, gather: .milliseconds(100), pace: .milliseconds(100)) { items in
            starts.withLock { $0.append(.now) }
            recorder.record(items)
            return items.map { _ in .success(()) }
        }
        // An item every 2 ms for 0.5 s: unpaced, a batch would start as soon as one ended.
        for i in 0..<250 {
            queue.enqueue(i)
            try await Task.sleep(for: .milliseconds(2))
        }
        await queue.flush()
        let times = starts.withLock { $0 }
        #expect(recorder.all.flatMap { $0 } == Array(0..<250))
        #expect(times.count >= 3, "\(times.count) batches")
        for (earlier, later) in zip(times, times.dropFirst()) {
            #expect(later - earlier >= .milliseconds(99), "\(later - earlier)")
        }
    }
}
