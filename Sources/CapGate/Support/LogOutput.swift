import Logging
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
    import Glibc
    private let systemWrite = Glibc.write
#elseif canImport(Darwin)
    import Darwin
    private let systemWrite = Darwin.write
#endif

/// Where log lines go. Warnings and more severe lines are written at once by the caller (after
/// anything gathered before them, so lines never reorder). While the output runs as a service
/// (`capgate serve` and `capgate dev` put it first in their service group, so it stops last),
/// lines below warning (info, notice, debug, trace) are gathered and written about every 5 ms,
/// one `write` for all of them instead of one per line, and what is left is written when it
/// stops. When it is not running (before it starts, after it stopped, in the one-shot commands)
/// every line is written at once. A crash can lose the last few milliseconds of lines below
/// warning, never a warning or an error.
///
/// The writer waits on an `AsyncStream` that a line yields into only when it is the first of a
/// batch, so a line costs a lock and an append.
public final class LogOutput: Service {
    public static let standardError = LogOutput(descriptor: 2)

    /// How long the writer waits for more lines after the first one arrives.
    static let gather = Duration.milliseconds(5)
    /// Past this many gathered bytes (the output cannot keep up) the caller writes them itself.
    static let limit = 4 << 20

    private struct State {
        var pending: [UInt8] = []
        /// Wakes the running writer; nil while none runs (lines are then written at once).
        var wake: AsyncStream<Void>.Continuation?
    }

    private let descriptor: Int32
    private let state = Mutex(State())
    /// Held while bytes are written, so that writes from the writer and from callers keep order.
    private let writing = Mutex(())

    init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    public func write(_ line: [UInt8], immediately: Bool) {
        if !immediately {
            let (gathered, wake, full) = state.withLock { state -> (Bool, AsyncStream<Void>.Continuation?, Bool) in
                guard let wake = state.wake else { return (false, nil, false) }
                let first = state.pending.isEmpty
                state.pending.append(contentsOf: line)
                return (true, first ? wake : nil, state.pending.count > Self.limit)
            }
            if gathered {
                wake?.yield()
                if full { flush() }
                return
            }
        }
        writing.withLock { _ in
            let earlier = takePending()
            writeAll(earlier.isEmpty ? line : earlier + line)
        }
    }

    /// Writes everything gathered so far.
    public func flush() {
        writing.withLock { _ in writeAll(takePending()) }
    }

    /// Gathers lines below warning until a graceful shutdown (or cancellation), then writes
    /// what is left and goes back to writing every line at once. One writer at a time: a second
    /// `run()` while one runs only waits for the shutdown.
    public func run() async throws {
        let (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let started = state.withLock { state in
            guard state.wake == nil else { return false }
            state.wake = wake
            return true
        }
        guard started else {
            try? await gracefulShutdown()
            return
        }
        await withGracefulShutdownHandler {
            for await _ in wakes {
                try? await Task.sleep(for: Self.gather)
                flush()
            }
        } onGracefulShutdown: {
            wake.finish()
        }
        state.withLock { $0.wake = nil }
        flush()
    }

    /// Whether lines below warning are being gathered (a writer runs).
    var isGathering: Bool {
        state.withLock { $0.wake != nil }
    }

    private func takePending() -> [UInt8] {
        state.withLock { state in
            var out: [UInt8] = []
            swap(&out, &state.pending)
            return out
        }
    }

    private func writeAll(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = systemWrite(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN || errno == EWOULDBLOCK {
                        // A non-blocking output that is full: wait for room rather than drop lines.
                        var ready = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
                        _ = poll(&ready, 1, 100)
                        continue
                    }
                    return
                }
                offset += written
            }
        }
    }
}
