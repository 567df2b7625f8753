/// Why a charge was given back (`capgate_refunds_total{reason}`).
enum RefundReason: String, Sendable, CaseIterable {
    /// The company's share of the gateway was full: the call was never forwarded.
    case share
    /// The provider did not answer in time.
    case timeout
    /// The provider could not be reached.
    case unreachable
    /// The provider answered with an error status.
    case upstreamStatus = "upstream_status"
    /// Its admission committed after the caller had been answered (or with its outcome unknown).
    case lateAdmission = "late_admission"
    /// A refund that waited in the spool while the database was unavailable.
    case spooled
}
