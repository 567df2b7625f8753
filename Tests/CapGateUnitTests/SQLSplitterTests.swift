import Testing

@testable import CapGate

/// The migration and function files are split into statements at top-level semicolons only.
@Suite("SQL splitter")
struct SQLSplitterTests {
    @Test("semicolons inside quotes, identifiers, dollar bodies and comments do not split; comments are dropped")
    func splits() {
        let sql = """
            -- a comment; with a semicolon
            CREATE TABLE "a;b" (x text DEFAULT 'it''s; fine');
            /* block; comment */ INSERT INTO t VALUES ('a', "q""; x");
            CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$
            BEGIN RETURN 1; END $body$;
            SELECT $$one;two$$, $1;;
            SELECT 'ünïcode; ✓'
            """
        #expect(
            SQLSplitter.statements(in: sql) == [
                #"CREATE TABLE "a;b" (x text DEFAULT 'it''s; fine')"#,
                #"INSERT INTO t VALUES ('a', "q""; x")"#,
                "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$\nBEGIN RETURN 1; END $body$",
                "SELECT $$one;two$$, $1",
                "SELECT 'ünïcode; ✓'",
            ])
    }

    @Test("an empty script, only semicolons or only comments gives no statement; an unclosed quote keeps the rest")
    func edges() {
        #expect(SQLSplitter.statements(in: "").isEmpty)
        #expect(SQLSplitter.statements(in: " ;; ;\n").isEmpty)
        #expect(SQLSplitter.statements(in: "-- only\n/* comments */").isEmpty)
        #expect(SQLSplitter.statements(in: "SELECT 'open; still") == ["SELECT 'open; still"])
        #expect(SQLSplitter.statements(in: "SELECT $tag$ open; still") == ["SELECT $tag$ open; still"])
    }
}
