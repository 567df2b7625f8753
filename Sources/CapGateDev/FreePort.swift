import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

extension EmbeddedPostgres {
    /// Ports this process handed out already: two picks in one process never collide.
    private static let handedOut = Mutex<Set<Int>>([])

    /// A TCP port on 127.0.0.1 that nobody listens on right now and that the kernel will not
    /// hand out on its own in the meantime.
    ///
    /// The port is taken from below the kernel's ephemeral range: a port from inside it (what
    /// binding port 0 returns) may be taken, between this pick and the caller's bind, by any
    /// outgoing connection or any other `bind(0)` on the machine, and under a loaded test run
    /// it was (`capgate dev --replica` spends 15 s starting two clusters before it binds its
    /// HTTP port). Falls back to the kernel's pick when the range leaves no room below it.
    public static func freePort() throws -> Int {
        let low = 20_000
        let high = ephemeralRangeStart() - 1
        guard high - low >= 1_000 else { return try bindable(0) }
        let span = high - low + 1
        let start = Int.random(in: 0..<span)
        for step in 0..<span {
            let port = low + (start + step) % span
            let fresh = handedOut.withLock { $0.insert(port).inserted }
            guard fresh, let bound = try? bindable(port) else { continue }
            return bound
        }
        return try bindable(0)
    }

    /// The first port of `net.ipv4.ip_local_port_range` (32768 when it cannot be read).
    public static func ephemeralRangeStart() -> Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        return text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.flatMap { Int($0) } ?? 32_768
    }

    /// Binds 127.0.0.1:`port` (0: the kernel's pick) without `SO_REUSEADDR`, so a port any socket
    /// still holds fails, and returns the port bound, released.
    private static func bindable(_ port: Int) throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw EmbeddedError.commandFailed("socket", "no socket") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else { throw EmbeddedError.commandFailed("bind", "port \(port) is taken") }
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { throw EmbeddedError.commandFailed("getsockname", "no free port") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
