import Foundation
import NIOCore
import Synchronization
import Testing

@testable import CapGate

/// SPEC §7: failed operator and metrics authentications throttled per client address (past 10
/// in a second: 429 with `Retry-After`), as a value with the time given and as the shared
/// throttle with an injected clock. No socket.
@Suite("Failed authentication throttle", .timeLimit(.minutes(1)))
struct FailedAuthThrottleTests {
    static func address(_ text: String) throws -> ClientAddress {
        ClientAddress(try SocketAddress(ipAddress: text, port: 40_000))
    }

    @Test("10 failures in a second pass, the 11th and later are refused with Retry-After 1; the next second allows again")
    func limit() throws {
        var window = FailedAuthWindow()
        let client = try Self.address("203.0.113.7")
        for i in 0..<10 {
            #expect(window.failure(from: client, at: .milliseconds(5_000 + i * 90)) == .allowed, "failure \(i + 1)")
        }
        #expect(window.failure(from: client, at: .milliseconds(5_950)) == .throttled(retryAfter: 1))
        #expect(window.failure(from: client, at: .milliseconds(5_999)) == .throttled(retryAfter: 1))
        #expect(window.failure(from: client, at: .milliseconds(6_000)) == .allowed)
        for _ in 1..<10 { #expect(window.failure(from: client, at: .milliseconds(6_500)) == .allowed) }
        #expect(window.failure(from: client, at: .milliseconds(6_500)) == .throttled(retryAfter: 1))
        // A later second, however much later, starts from nothing.
        #expect(window.failure(from: client, at: .seconds(3_600)) == .allowed)
    }

    @Test("another address is counted apart: one being throttled leaves the others their 10")
    func otherAddresses() throws {
        var window = FailedAuthWindow()
        let attacker = try Self.address("203.0.113.7")
        for _ in 0..<50 { _ = window.failure(from: attacker, at: .seconds(1)) }
        #expect(window.failure(from: attacker, at: .seconds(1)) == .throttled(retryAfter: 1))
        for other in ["203.0.113.8", "198.51.100.7", "2001:db8:1::1"] {
            let client = try Self.address(other)
            for _ in 0..<10 { #expect(window.failure(from: client, at: .seconds(1)) == .allowed, "\(other)") }
            #expect(window.failure(from: client, at: .seconds(1)) == .throttled(retryAfter: 1), "\(other)")
        }
    }

    @Test("the address is the peer's: IPv4 by address, IPv6 by its /64, IPv4-mapped IPv6 as its IPv4, no IP as unknown")
    func addresses() throws {
        #expect(try Self.address("192.0.2.1") != Self.address("192.0.2.2"))
        #expect(try Self.address("192.0.2.1") == Self.address("::ffff:192.0.2.1"))
        #expect(try Self.address("2001:db8:aa:bb::1") == Self.address("2001:db8:aa:bb:ffff:1:2:3"))
        #expect(try Self.address("2001:db8:aa:bb::1") != Self.address("2001:db8:aa:bc::1"))
        #expect(try Self.address("::1") != Self.address("127.0.0.1"))
        #expect(try Self.address("::") != Self.address("0.0.0.0"))
        #expect(ClientAddress(nil) == .unknown)
        #expect(ClientAddress(try SocketAddress(unixDomainSocketPath: "/tmp/capgate.sock")) == .unknown)
    }

    @Test("the table holds at most its capacity: addresses past it share one count, and a new second empties it")
    func bounded() throws {
        var window = FailedAuthWindow(limit: 10, capacity: 100)
        for i in 0..<100 {
            #expect(window.failure(from: ClientAddress(high: 1, low: UInt64(i)), at: .seconds(7)) == .allowed)
        }
        #expect(window.tracked == 100)
        // A spray of further addresses in the same second: the table does not grow; together
        // they have one address's 10.
        for i in 0..<10 {
            #expect(window.failure(from: ClientAddress(high: 2, low: UInt64(i)), at: .seconds(7)) == .allowed)
        }
        for i in 10..<1_000 {
            #expect(window.failure(from: ClientAddress(high: 2, low: UInt64(i)), at: .seconds(7)) == .throttled(retryAfter: 1))
        }
        #expect(window.tracked == 100)
        // Those already in the table keep their own counts.
        #expect(window.failure(from: ClientAddress(high: 1, low: 0), at: .seconds(7)) == .allowed)
        // The next second's first failure drops every count of the last.
        #expect(window.failure(from: ClientAddress(high: 2, low: 999), at: .seconds(8)) == .allowed)
        #expect(window.tracked == 1)
    }

    @Test("the shared throttle reads its injected clock; only failures are counted, so a success is never refused")
    func sharedWithClock() throws {
        let clock = Mutex<Duration>(.seconds(100))
        let throttle = FailedAuthThrottle(now: { clock.withLock { $0 } })
        let client = try Self.address("192.0.2.10")
        // Successes go nowhere near it: a client that authenticates leaves no count.
        #expect(throttle.tracked == 0)
        for _ in 0..<10 { #expect(throttle.failure(from: client) == .allowed) }
        #expect(throttle.failure(from: client) == .throttled(retryAfter: 1))
        #expect(throttle.tracked == 1)
        clock.withLock { $0 = .milliseconds(100_999) }
        #expect(throttle.failure(from: client) == .throttled(retryAfter: 1))
        clock.withLock { $0 = .seconds(101) }
        #expect(throttle.failure(from: client) == .allowed)
        #expect(try throttle.failure(from: Self.address("192.0.2.11")) == .allowed)
    }
}
