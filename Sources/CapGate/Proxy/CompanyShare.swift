import Foundation
import Synchronization

/// One company's share of a resource every company uses (SPEC §2, `proxy.companyShare`): at
/// most `limit` units of it at once per company, so one tenant's slow or huge calls cannot take
/// what the others need. Two are used: bytes of request bodies being read (refused past the
/// share: 503) and calls waiting on the provider (queued past the share, first come first
/// served, until a slot frees or the wait's deadline passes).
final class CompanyShare: Sendable {
    /// The most one company may hold at once.
    let limit: Int

    private struct Waiter {
        var id: Int
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var held: [UUID: Int] = [:]
        var waiters: [UUID: [Waiter]] = [:]
        var nextID = 0
    }

    private let state = Mutex(State())

    /// `percent` of `total`, at least 1.
    init(total: Int, percent: Int) {
        limit = max(1, Int((Int64(total) * Int64(percent)) / 100))
    }

    /// Takes `amount` for `company` if its share has room; never waits.
    func take(_ amount: Int, for company: UUID) -> Bool {
        guard amount > 0 else { return true }
        return state.withLock { state in
            let held = state.held[company, default: 0]
            guard amount <= limit - held else { return false }
            state.held[company] = held + amount
            return true
        }
    }

    /// Gives back `amount` taken earlier; a waiting call of the company gets a freed slot.
    func give(_ amount: Int, for company: UUID) {
        guard amount > 0 else { return }
        let woken: [CheckedContinuation<Bool, Never>] = state.withLock { state in
            var held = state.held[company, default: 0] - amount
            var woken: [CheckedContinuation<Bool, Never>] = []
            while held < limit, var queue = state.waiters[company], !queue.isEmpty {
                woken.append(queue.removeFirst().continuation)
                state.waiters[company] = queue.isEmpty ? nil : queue
                held += 1
            }
            state.held[company] = held > 0 ? held : nil
            return woken
        }
        for continuation in woken { continuation.resume(returning: true) }
    }

    /// One slot for `company`: at once when its share has room, else in its queue until a slot
    /// is handed over (true) or `timeout` passes or the task is cancelled (false).
    func acquire(for company: UUID, timeout: Duration) async -> Bool {
        if take(1, for: company) { return true }
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        let expiry = Task {
            try? await Task.sleep(for: timeout)
            self.abandon(id, of: company)
        }
        defer { expiry.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let granted = state.withLock { state -> Bool? in
                    if Task.isCancelled { return nil }
                    // A slot may have freed since `take` failed.
                    let held = state.held[company, default: 0]
                    if held < limit, state.waiters[company]?.isEmpty ?? true {
                        state.held[company] = held + 1
                        return true
                    }
                    state.waiters[company, default: []].append(Waiter(id: id, continuation: continuation))
                    return false
                }
                if let granted, !granted { return }
                continuation.resume(returning: granted ?? false)
            }
        } onCancel: {
            self.abandon(id, of: company)
        }
    }

    /// Takes a waiting call out of its queue and answers it false; nothing if it was served.
    private func abandon(_ id: Int, of company: UUID) {
        let waiter: Waiter? = state.withLock { state in
            guard var queue = state.waiters[company], let index = queue.firstIndex(where: { $0.id == id }) else { return nil }
            let waiter = queue.remove(at: index)
            state.waiters[company] = queue.isEmpty ? nil : queue
            return waiter
        }
        waiter?.continuation.resume(returning: false)
    }

    /// What `company` holds now (for tests).
    func held(by company: UUID) -> Int { state.withLock { $0.held[company, default: 0] } }
}

/// A slot of ``CompanyShare`` held by one call, given back exactly once: when the call's answer
/// ends, or when the last reference goes (a response body that was never written).
final class ShareTicket: Sendable {
    private let share: CompanyShare
    private let company: UUID
    private let released = Atomic(false)

    init(share: CompanyShare, company: UUID) {
        self.share = share
        self.company = company
    }

    func release() {
        if !released.exchange(true, ordering: .acquiringAndReleasing) { share.give(1, for: company) }
    }

    deinit { release() }
}
