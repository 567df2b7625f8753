import Testing

@testable import CapGate

/// ``Migrator/through(_:)``: the migrations an earlier release had, for the tests of an upgrade
/// (the ledger's partitions, 0026, are tested against a database of 0025).
@Suite("Migrator through a version")
struct MigratorThroughTests {
    @Test("through 0025: 0001 to 0025 in order with the same functions; a whole name is the same; nothing before 0001")
    func through() {
        let all = Migrator()
        let old = all.through("0025")
        #expect(old.migrations.map(\.version).first == "0001_schema")
        #expect(old.migrations.map(\.version).last == "0025_ledger_exports")
        #expect(old.migrations.count == 25)
        #expect(all.through("0025_ledger_exports").migrations.map(\.version) == old.migrations.map(\.version))
        #expect(old.functions?.files.map(\.name) == all.functions?.files.map(\.name))
        #expect(all.migrations.contains { $0.version == "0026_ledger_partitions" })
        #expect(all.through("0000").migrations.isEmpty)
    }
}
