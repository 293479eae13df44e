//! Schema 4 → 5 (the routes table), 5 → 6 (the sentinels' index by
//! environment) and 6 → 7 (the revocations table): state files and
//! snapshots written by the previous formats are read by this build, with
//! no routes, every sentinel found by its environment, and no
//! revocations.

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
/// it was when schema 5 came) imports, and exports as the current golden
/// of the same store: nothing lost, no routes.
#[test]
fn a_schema_4_snapshot_imports_as_the_same_state() {
    let v4 = hex(include_str!("migration/snapshot.schema4.hex"));
    let golden = include_str!("golden/snapshot.hex");
    let v6 = golden
        .lines()
        .find_map(|l| l.strip_prefix("case snapshot "))
        .map(hex)
        .expect("the golden snapshot");
    assert!(golden.contains("version SCHEMA_VERSION 7"));
    let store = Store::in_memory().expect("store");
    store
        .import_snapshot(&v4)
        .expect("a schema-4 snapshot imports");
    let (exported, _) = store.export_snapshot().expect("export");
    assert_eq!(exported, v6, "the imported state is the populated store's");
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
        txn.delete_table(tables::REVOCATIONS)
            .expect("drop revocations");
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

/// The environment, region and id of the populated store's one sentinel:
/// an id other than the one a deploy would give it, so only the index
/// finds it by its environment.
const SENTINEL: (&str, &str, &str) = ("env_prod", "eu-west", "snt_01hx");

/// Whether `store` finds the populated store's sentinel by its
/// environment.
fn finds_the_sentinel(store: &Store) -> bool {
    let (environment, region, id) = SENTINEL;
    let likely = wire::rules::deploy::sentinel_id(environment, region);
    assert_ne!(likely, id, "the fixture's id is not the likely one");
    let view = store.read().expect("read");
    view.environment_sentinel(environment, region, &likely)
        .expect("read")
        .is_some_and(|s| s.id == id)
}

/// The schema-5 snapshot of the populated store (kept as it was when
/// schema 6 came) imports as the same state, and its sentinel is found by
/// its environment: the index is derived at import.
#[test]
fn a_schema_5_snapshot_imports_with_its_sentinels_indexed() {
    let v5 = hex(include_str!("migration/snapshot.schema5.hex"));
    let v6 = include_str!("golden/snapshot.hex")
        .lines()
        .find_map(|l| l.strip_prefix("case snapshot "))
        .map(hex)
        .expect("the golden snapshot");
    let store = Store::in_memory().expect("store");
    store
        .import_snapshot(&v5)
        .expect("a schema-5 snapshot imports");
    assert_eq!(store.export_snapshot().expect("export").0, v6);
    assert!(finds_the_sentinel(&store));
}

/// A state file of schema 5 opens: migrated in place to 6, the indexes
/// built from the sentinels, open deployments and policies it holds.
#[test]
fn a_schema_5_state_file_is_migrated_in_place_with_its_index() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    {
        let store = Store::open(&path).expect("create");
        let v5 = hex(include_str!("migration/snapshot.schema5.hex"));
        store.import_snapshot(&v5).expect("import");
    }
    // As schema 5 left it: no index table.
    {
        let db = redb::Database::open(&path).expect("redb");
        let txn = db.begin_write().expect("write");
        assert!(
            txn.delete_table(tables::ENVIRONMENT_SENTINELS)
                .expect("drop the index")
        );
        assert!(
            txn.delete_table(tables::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)
                .expect("drop the index")
        );
        assert!(
            txn.delete_table(tables::POLICIES_BY_NAME)
                .expect("drop the index")
        );
        assert!(
            txn.delete_table(tables::REVOCATIONS)
                .expect("drop the revocations")
        );
        txn.open_table(tables::METADATA)
            .expect("metadata")
            .insert(meta::SCHEMA_VERSION, &5u32.to_le_bytes()[..])
            .expect("schema 5");
        txn.commit().expect("commit");
    }
    let store = Store::open(&path).expect("a schema-5 file opens");
    assert_eq!(
        store.read().expect("read").schema_version(),
        storage::SCHEMA_VERSION
    );
    assert!(finds_the_sentinel(&store), "the migration built the index");
    let view = store.read().expect("read");
    let open = view.open_deployments(100).expect("read");
    assert!(!open.is_empty(), "the populated store has open deployments");
    for deployment in open {
        let of_environment = view
            .open_environment_deployments(&deployment.environment_id, 100)
            .expect("read");
        assert!(
            of_environment.iter().any(|d| d.id == deployment.id),
            "{} is found by its environment",
            deployment.id
        );
    }
    drop(view);
    // The populated store's policy holds its name against another
    // environment: found through the rebuilt index.
    let mut other = wire::golden::fixtures::policy();
    other.id = "cnp_other".into();
    other.environment_id = "env_other".into();
    let command = storage::Command {
        now_ms: 1,
        mutations: vec![storage::Mutation::UpsertCiliumNetworkPolicy(other)],
    };
    let meta = storage::RaftMeta {
        last_applied: Vec::new(),
        membership: Vec::new(),
    };
    let applied = store.apply(&[Some(&command)], &meta, true).expect("apply");
    let refused = applied.outcomes[0][0].clone().unwrap_err();
    assert_eq!(refused.code, wire::ErrorCode::Conflict, "{refused}");
}

/// The golden snapshot of the current schema.
fn golden_snapshot() -> Vec<u8> {
    include_str!("golden/snapshot.hex")
        .lines()
        .find_map(|l| l.strip_prefix("case snapshot "))
        .map(hex)
        .expect("the golden snapshot")
}

/// The schema-6 snapshot of the populated store (kept as it was when
/// schema 7 came) imports as the same state, with no revocations.
#[test]
fn a_schema_6_snapshot_imports_with_no_revocations() {
    let v6 = hex(include_str!("migration/snapshot.schema6.hex"));
    let store = Store::in_memory().expect("store");
    store
        .import_snapshot(&v6)
        .expect("a schema-6 snapshot imports");
    assert_eq!(
        store.export_snapshot().expect("export").0,
        golden_snapshot()
    );
    assert!(
        store
            .read()
            .expect("read")
            .revocations()
            .expect("read")
            .is_empty()
    );
}

/// A state file of schema 6 opens: migrated in place to 7, the
/// revocations table created empty, every other row kept.
#[test]
fn a_schema_6_state_file_is_migrated_in_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    {
        let store = Store::open(&path).expect("create");
        let v6 = hex(include_str!("migration/snapshot.schema6.hex"));
        store.import_snapshot(&v6).expect("import");
    }
    {
        let db = redb::Database::open(&path).expect("redb");
        let txn = db.begin_write().expect("write");
        assert!(
            txn.delete_table(tables::REVOCATIONS)
                .expect("drop the revocations")
        );
        txn.open_table(tables::METADATA)
            .expect("metadata")
            .insert(meta::SCHEMA_VERSION, &6u32.to_le_bytes()[..])
            .expect("schema 6");
        txn.commit().expect("commit");
    }
    let store = Store::open(&path).expect("a schema-6 file opens");
    let view = store.read().expect("read");
    assert_eq!(view.schema_version(), storage::SCHEMA_VERSION);
    assert!(view.revocations().expect("read").is_empty());
    drop(view);
    assert_eq!(
        store.export_snapshot().expect("export").0,
        golden_snapshot()
    );
}
