//! Schema 4 → 5 (the routes table): a state file and a snapshot written
//! by the previous format are read by this build, with no routes.

use storage::Store;
use storage::tables::{self, meta};

fn hex(text: &str) -> Vec<u8> {
    let text = text.trim();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The schema-4 snapshot of the golden test's populated store (kept as
/// it was when schema 5 came) imports, and exports as the schema-5 golden
/// of the same store: nothing lost, no routes.
#[test]
fn a_schema_4_snapshot_imports_as_the_same_state() {
    let v4 = hex(include_str!("migration/snapshot.schema4.hex"));
    let golden = include_str!("golden/snapshot.hex");
    let v5 = golden
        .lines()
        .find_map(|l| l.strip_prefix("case snapshot "))
        .map(hex)
        .expect("the golden snapshot");
    assert!(golden.contains("version SCHEMA_VERSION 5"));
    let store = Store::in_memory().expect("store");
    store
        .import_snapshot(&v4)
        .expect("a schema-4 snapshot imports");
    let (exported, _) = store.export_snapshot().expect("export");
    assert_eq!(exported, v5, "the imported state is the populated store's");
}

/// A state file of schema 4 opens: migrated in place to 5, the routes
/// table created empty, every other row kept.
#[test]
fn a_schema_4_state_file_is_migrated_in_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    drop(Store::open(&path).expect("create"));
    {
        let db = redb::Database::open(&path).expect("redb");
        let txn = db.begin_write().expect("write");
        txn.delete_table(tables::ROUTES).expect("drop routes");
        txn.open_table(tables::METADATA)
            .expect("metadata")
            .insert(meta::SCHEMA_VERSION, &4u32.to_le_bytes()[..])
            .expect("schema 4");
        txn.commit().expect("commit");
    }
    let store = Store::open(&path).expect("a schema-4 file opens");
    let view = store.read().expect("read");
    assert_eq!(view.schema_version(), storage::SCHEMA_VERSION);
    assert_eq!(view.environment_route("prod", "eu").expect("read"), None);
    drop(view);
    drop(store);

    // A schema it does not know is still refused.
    {
        let db = redb::Database::open(&path).expect("redb");
        let txn = db.begin_write().expect("write");
        txn.open_table(tables::METADATA)
            .expect("metadata")
            .insert(meta::SCHEMA_VERSION, &3u32.to_le_bytes()[..])
            .expect("schema 3");
        txn.commit().expect("commit");
    }
    let err = Store::open(&path).err().expect("schema 3 is refused");
    assert!(err.to_string().contains('3'), "{err}");
}
