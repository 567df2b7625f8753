import NIOCore

/// Whom a failed operator or metrics authentication is counted against (SPEC §7): the TCP
/// peer's address, never a header (CapGate reads no `X-Forwarded-For`: any client could write
/// one). An IPv6 client is counted by its /64, the block one host or site is given (else an
/// attacker would have 2^64 addresses to move through); an IPv4-mapped IPv6 address is its
/// IPv4 address. A peer with no IP address (a Unix socket, a test channel) is ``unknown``.
struct ClientAddress: Hashable, Sendable {
    /// IPv4 as `::ffff:a.b.c.d` (high 0, low `0xffff` then the address); IPv6 as its first 64
    /// bits in `high` and 0 in `low`.
    let high: UInt64
    let low: UInt64

    /// A peer without an IP address (`ff…` is multicast, never a peer's /64).
    static let unknown = ClientAddress(high: .max, low: .max)

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    init(_ address: SocketAddress?) {
        switch address {
        case .v4(let v4):
            self = Self(ipv4: UInt32(bigEndian: v4.address.sin_addr.s_addr))
        case .v6(let v6):
            let bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
            guard bytes.count == 16 else {
                self = .unknown
                return
            }
            if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xff && bytes[11] == 0xff {
                self = Self(ipv4: bytes[12..<16].reduce(0) { $0 << 8 | UInt32($1) })
            } else {
                self = Self(high: bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) }, low: 0)
            }
        case .unixDomainSocket, nil:
            self = .unknown
        }
    }

    private init(ipv4: UInt32) {
        self.init(high: 0, low: 0xffff << 32 | UInt64(ipv4))
    }
}
