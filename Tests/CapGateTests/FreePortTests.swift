import CapGateDev
import NIOCore
import NIOPosix
import Testing

@Suite("Free ports for the embedded clusters, the dev server and the tests' receivers", .timeLimit(.minutes(10)))
struct FreePortTests {
    @Test("picks come from below the kernel's ephemeral range, never twice in a process, and bind")
    func belowEphemeralRange() async throws {
        let ephemeral = EmbeddedPostgres.ephemeralRangeStart()
        var seen = Set<Int>()
        for _ in 0..<200 {
            let port = try EmbeddedPostgres.freePort()
            #expect(port >= 20_000 && port < ephemeral, "port \(port) is inside the ephemeral range from \(ephemeral)")
            #expect(seen.insert(port).inserted, "port \(port) handed out twice")
        }
        // The last pick binds as a server would.
        let port = try EmbeddedPostgres.freePort()
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: port).get()
        #expect(server.localAddress?.port == port)
        try await server.close()
    }
}
