import Foundation
import Testing

@testable import CapGate

/// ``Migrator/through(_:)``: the migrations an earlier release had, for the tests of an upgrade
/// (the ledger's partitions, 0026, are tested against a database of 0025, with the migrations from
/// before the baseline kept in `Tests/CapGateTests/Fixtures/migrations/`).
@Suite("Migrator through a version")
struct MigratorThroughTests {
    static let oldFolder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("CapGateTests/Fixtures/migrations").path

    @Test("through 0025: 0001 to 0025 in order with the same functions; a whole name is the same; nothing before 0001")
    func through() throws {
        let all = try Migrator(folder: Self.oldFolder)
        let old = all.through("0025")
        #expect(old.migrations.map(\.version).first == "0001_schema")
        #expect(old.migrations.map(\.version).last == "0025_ledger_exports")
        #expect(old.migrations.count == 25)
        #expect(all.through("0025_ledger_exports").migrations.map(\.version) == old.migrations.map(\.version))
        #expect(old.functions?.files.map(\.name) == all.functions?.files.map(\.name))
        #expect(all.migrations.contains { $0.version == "0026_ledger_partitions" })
        #expect(all.migrations.last?.version == Migrator.Baseline.replaces)
        #expect(all.through("0000").migrations.isEmpty)
    }
}

/// The rule of the baseline (`db/migrations/0030_baseline.sql`, issue #48 item 5), on the rows a
/// database's `capgate_migrations` holds: what a run does, without a database.
@Suite("Migrator: the baseline's steps")
struct MigratorBaselineStepsTests {
    static let baseline = Migrator.Migration(name: "0030_baseline.sql", sql: "CREATE TABLE t (a int);")
    static let later = Migrator.Migration(name: "0031_later.sql", sql: "ALTER TABLE t ADD b int;")

    /// The steps' names, or the error's description.
    static func steps(_ applied: [String: String], _ migrations: [Migrator.Migration] = [baseline, later]) -> [String] {
        do {
            return try Migrator.steps(migrations, applied: applied).map { step in
                switch step {
                case .run(let migration): "run " + migration.version
                case .record(let migration): "record " + migration.version
                }
            }
        } catch {
            return ["error: \(error)"]
        }
    }

    static func old(through last: Int) -> [String: String] {
        Dictionary(uniqueKeysWithValues: (1...last).map { (String(format: "%04d_old", $0), "checksum") })
    }

    @Test("the embedded migrations start with the baseline, the version the rule knows")
    func embedded() {
        #expect(Migrator().migrations.first?.version == Migrator.Baseline.version)
        #expect(!Migrator().migrations.contains { Migrator.Baseline.isReplaced($0.version) })
    }

    @Test("a new database runs the baseline and what follows")
    func fresh() {
        #expect(Self.steps([:]) == ["run 0030_baseline", "run 0031_later"])
    }

    @Test("a database whose migrations reach 0029 records the baseline without running it, then runs what follows")
    func atReplaced() {
        var applied = Self.old(through: 28)
        applied[Migrator.Baseline.replaces] = "checksum"
        #expect(Self.steps(applied) == ["record 0030_baseline", "run 0031_later"])
        // Recorded: the old rows are history, nothing is pending.
        applied[Self.baseline.version] = Self.baseline.checksum
        applied[Self.later.version] = Self.later.checksum
        #expect(Self.steps(applied) == [])
    }

    @Test("a database at an older migration is refused with its last migration named")
    func older() {
        #expect(
            Self.steps(Self.old(through: 25)) == ["error: \(Migrator.MigrationError.tooOld("0025_old"))"])
        #expect(Self.steps(Self.old(through: 25)).first?.contains(Migrator.Baseline.lastCommitBefore) == true)
    }

    @Test("after the baseline: an unknown migration and a changed one are refused as before")
    func unknownAndChanged() {
        var applied = [Self.baseline.version: Self.baseline.checksum]
        #expect(Self.steps(applied) == ["run 0031_later"])
        applied["0032_newer"] = "x"
        #expect(Self.steps(applied) == ["error: \(Migrator.MigrationError.unknownApplied("0032_newer"))"])
        #expect(
            Self.steps([Self.baseline.version: "other"])
                == ["error: \(Migrator.MigrationError.changedAfterApplied(Self.baseline.version))"])
    }

    @Test("migrations without the baseline (the old files, for the upgrade tests): every one runs, none is retired")
    func withoutBaseline() {
        let first = Migrator.Migration(name: "0001_old.sql", sql: "SELECT 1;")
        let second = Migrator.Migration(name: "0002_old.sql", sql: "SELECT 2;")
        #expect(Self.steps([:], [first, second]) == ["run 0001_old", "run 0002_old"])
        #expect(Self.steps([first.version: first.checksum], [first, second]) == ["run 0002_old"])
        #expect(Self.steps(["0000_gone": "x"], [first]) == ["error: \(Migrator.MigrationError.unknownApplied("0000_gone"))"])
    }
}
