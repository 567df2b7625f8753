import CapGate
import Foundation
import Testing

@Suite("database.url: single and multi-host")
struct DatabaseURLTests {
    @Test("a single-host URL parses and prints as before")
    func singleHost() throws {
        let url = try DatabaseURL("postgres://capgate:s%40cret@db.example.com:5433/billing?sslmode=require")
        #expect(url.host == "db.example.com")
        #expect(url.port == 5433)
        #expect(url.username == "capgate")
        #expect(url.password == "s@cret")
        #expect(url.database == "billing")
        #expect(url.sslMode == "require")
        #expect(!url.isMultiHost)
        #expect(url.hosts == [.init(host: "db.example.com", port: 5433)])
        #expect(url.targetSessionAttrs == nil)
        #expect(url.text == "postgres://capgate:s%40cret@db.example.com:5433/billing?sslmode=require")
        let plain = try DatabaseURL("postgresql://u@localhost/db")
        #expect(plain.port == 5432 && plain.password == nil && plain.sslMode == "prefer")
        #expect(plain.text == "postgres://u@localhost:5432/db?sslmode=prefer")
    }

    @Test("several hosts as libpq writes them: each with its port, default 5432, IPv6 in brackets, round trip through text")
    func multiHost() throws {
        let url = try DatabaseURL("postgres://u:p%2Fw@h1:5432,h2:5433/db?target_session_attrs=read-write")
        #expect(url.isMultiHost)
        #expect(url.hosts == [.init(host: "h1", port: 5432), .init(host: "h2", port: 5433)])
        #expect(url.host == "h1" && url.port == 5432)
        #expect(url.username == "u" && url.password == "p/w" && url.database == "db")
        #expect(url.targetSessionAttrs == "read-write")
        let again = try DatabaseURL(url.text)
        #expect(again.hosts == url.hosts && again.password == "p/w" && again.database == "db" && again.targetSessionAttrs == "read-write")
        #expect(url.redacted == "postgres://u:xxxxx@h1:5432,h2:5433/db?sslmode=prefer&target_session_attrs=read-write")

        let defaults = try DatabaseURL("postgresql://h1,h2:6000,h3/app")
        #expect(defaults.hosts.map(\.port) == [5432, 6000, 5432])
        #expect(defaults.username == "postgres" && defaults.database == "app")

        let v6 = try DatabaseURL("postgres://u@[::1]:5432,[fe80::2]:5433/db")
        #expect(v6.hosts == [.init(host: "::1", port: 5432), .init(host: "fe80::2", port: 5433)])
        #expect(try DatabaseURL(v6.text).hosts == v6.hosts)

        let one = url.only(url.hosts[1])
        #expect(!one.isMultiHost && one.host == "h2" && one.port == 5433 && one.password == "p/w")
    }

    @Test("a bad host list or a target_session_attrs that cannot write is a configuration error")
    func rejected() {
        for text in [
            "postgres://u@h1:5432,/db", "postgres://u@h1:5432,:5433/db", "postgres://u@h1:x,h2/db", "postgres://u@h1,h2:70000/db",
            "postgres://u@[::1,h2/db", "postgres://u@h1,h2/db?target_session_attrs=read-only",
            "postgres://u@h1,h2/db?target_session_attrs=standby", "mysql://u@h1,h2/db",
        ] {
            #expect(throws: ConfigurationError.self, "\(text)") { try DatabaseURL(text) }
        }
        #expect(throws: Never.self) { try DatabaseURL("postgres://u@h1,h2/db?target_session_attrs=primary") }
    }
}
