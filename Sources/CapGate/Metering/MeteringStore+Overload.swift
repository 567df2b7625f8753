import Foundation

/// Bounded waits for admission: a call queued behind the admission transaction in flight gives
/// up at `database.timeout` from its arrival (503, fail closed), however long the queue, and at
/// most `database.admissionQueueLimit` calls queue at once (503 at once past it).
///
/// A call that gave up is never left charged: while it is still queued it is dropped from the
/// next batch; if its batch was already in flight and commits, its charge is given back
/// (``LateAdmissions``), as for a batch that commits after its own deadline.
///
/// The next batch starts as soon as the current one's statement answered
/// (`admitBatch`'s `answered`), while the current one waits for the acknowledgement of its commit:
/// its row locks are released by that commit, so the next statement waits for nothing it would
/// not wait for anyway, and the proof's round trip leaves the batch cycle. The current batch's
/// callers are still answered only once its commit is acknowledged.
extension MeteringStore {
    /// The default of `database.admissionQueueLimit`.
    public static let defaultAdmissionQueueLimit = 10_000

    static func admissionQueue(
        database: Database, relaxed: Bool, queueLimit: Int, spool: Spool?, slotEnds: SlotEnds
    ) -> BatchQueue<AdmissionItem, AdmissionRow> {
        BatchQueue(
            maxBatch: maxBatch, waitLimit: database.timeout, queueLimit: queueLimit, rejection: overloaded,
            late: { item, result in
                LateAdmissions(items: [item], database: database, spool: spool).committedLate(result.map { [$0] })
            },
            overlapsAtAnswer: true,
            process: { items, release in
                await admitBatch(
                    items, database: database, relaxed: relaxed, spool: spool, slotEnds: slotEnds, answered: { release() })
            }
        )
    }

    @Sendable static func overloaded(_ rejection: BatchQueueRejection) -> any Error {
        switch rejection {
        case .waitedTooLong:
            return GatewayError.overloaded(
                "The usage database did not answer in time, so the call was not forwarded. Try again shortly.")
        case .queueFull:
            return GatewayError.overloaded(
                "Too many calls are waiting for the usage database, so this one was not forwarded. Try again shortly.")
        }
    }
}
