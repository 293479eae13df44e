//! Tests of `storage/src/lib`.
use std::io;
use std::sync::{Arc, Mutex};

use super::*;
use crate::test_support::*;

#[test]
fn reopening_a_file_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (hash, raft, answers) = {
        let store = Store::open(&path).unwrap();
        register_regions(&store);
        apply_one(&store, 1, create("d1", &["eu", "us"], 1));
        apply_one(
            &store,
            2,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu"))],
        );
        // A non-durable commit, then a drop without close: redb makes it
        // durable when the database is dropped.
        let command = Command {
            now_ms: 3,
            mutations: vec![Mutation::Compact(crate::mutations::Compact {
                created_before_ms: 2,
                rows_max: 1,
                requests_created_before_ms: 0,
                keep_rows_min: 0,
            })],
        };
        store
            .apply(&[Some(&command)], &raft_meta(3), false)
            .unwrap();
        let view = store.read().unwrap();
        (
            view.state_hash().unwrap(),
            view.raft_meta(),
            view.changes_after("eu", 0, 10).unwrap(),
        )
    };
    let store = Store::open(&path).unwrap();
    let view = store.read().unwrap();
    assert_eq!(view.state_hash().unwrap(), hash);
    assert_eq!(view.raft_meta(), raft);
    assert_eq!(raft, Some(raft_meta(3)));
    assert_eq!((view.floor_pk(), view.last_pk()), (1, 3));
    assert_eq!(view.changes_after("eu", 0, 10).unwrap(), answers);
}

#[test]
fn another_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    drop(Store::open(&path).unwrap());
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(tables::METADATA)
            .unwrap()
            .insert(meta::SCHEMA_VERSION, &99u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let err = Store::open(&path).err().expect("refused");
    assert!(
        matches!(
            err,
            StorageError::SchemaMismatch {
                found: 99,
                expected: SCHEMA_VERSION,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    std::fs::write(&path, b"definitely not redb, just some text").unwrap();
    assert!(matches!(Store::open(&path), Err(StorageError::Open { .. })));
}

/// A backend that separates written bytes from durable (synced) ones, as
/// redb's own crash tests do: a crash keeps only what was synced.
#[derive(Debug, Default)]
struct CrashBackend {
    written: Arc<Mutex<Vec<u8>>>,
    durable: Arc<Mutex<Vec<u8>>>,
}

impl CrashBackend {
    fn from_image(image: Vec<u8>) -> Self {
        CrashBackend {
            written: Arc::new(Mutex::new(image.clone())),
            durable: Arc::new(Mutex::new(image)),
        }
    }
}

impl StorageBackend for CrashBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.written.lock().unwrap().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let written = self.written.lock().unwrap();
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset past usize"))?;
        let source = written
            .get(start..start + out.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))?;
        out.copy_from_slice(source);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.written.lock().unwrap().resize(
            usize::try_from(len).map_err(|_| io::Error::other("length past usize"))?,
            0,
        );
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let written = self.written.lock().unwrap().clone();
        *self.durable.lock().unwrap() = written;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut written = self.written.lock().unwrap();
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset past usize"))?;
        let target = written
            .get_mut(start..start + data.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "write past end"))?;
        target.copy_from_slice(data);
        Ok(())
    }
}

fn commands() -> Vec<Command> {
    (1..=6u64)
        .map(|i| Command {
            now_ms: i,
            mutations: mutations![
                create(&format!("d{i}"), &["eu", "us"], 1),
                Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu")),
            ],
        })
        .collect()
}

fn hash_and_meta(store: &Store) -> (u64, Option<RaftMeta>) {
    let view = store.read().unwrap();
    (view.state_hash().unwrap(), view.raft_meta())
}

#[test]
fn a_crash_keeps_the_last_durable_apply_and_its_raft_meta() {
    let commands = commands();
    let backend = CrashBackend::default();
    let durable = backend.durable.clone();
    let written = backend.written.clone();
    let (written_image, durable_image);
    let (after_durable, after_all) = {
        let store = Store::with_backend(backend).unwrap();
        for (i, command) in commands[..3].iter().enumerate() {
            store
                .apply(&[Some(command)], &raft_meta(i as u64 + 1), true)
                .unwrap();
        }
        let after_durable = hash_and_meta(&store);
        for (i, command) in commands[3..].iter().enumerate() {
            store
                .apply(&[Some(command)], &raft_meta(i as u64 + 4), false)
                .unwrap();
        }
        let after_all = hash_and_meta(&store);
        // A process crash here: the OS may or may not have written the
        // unsynced bytes. Take both images before the clean drop below
        // (which would make everything durable).
        written_image = written.lock().unwrap().clone();
        durable_image = durable.lock().unwrap().clone();
        (after_durable, after_all)
    };

    // Power loss: only synced bytes survive.
    let store = Store::with_backend(CrashBackend::from_image(durable_image)).unwrap();
    assert_eq!(hash_and_meta(&store), after_durable);
    assert_eq!(after_durable.1, Some(raft_meta(3)));
    // Raft re-applies the lost entries; apply is deterministic.
    for (i, command) in commands[3..].iter().enumerate() {
        store
            .apply(&[Some(command)], &raft_meta(i as u64 + 4), true)
            .unwrap();
    }
    assert_eq!(hash_and_meta(&store), after_all);

    // Process crash: every written byte survives; the state is one of
    // the committed ones, and its raft meta is the one committed with it.
    let store = Store::with_backend(CrashBackend::from_image(written_image)).unwrap();
    let recovered = hash_and_meta(&store);
    assert!(
        recovered == after_durable || recovered == after_all,
        "{recovered:?}"
    );
}
