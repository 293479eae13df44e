//! Scheduled backups on a three-node cluster: with a short interval the
//! leader writes backup files into its `[backup]` directory, each verified
//! (`ctrl backup verify` accepts what is left), and prunes them to `keep`;
//! the followers write none.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, POLL_INTERVAL, row_of};

/// Bound on the leader writing and pruning backups at a one-second
/// interval.
const BACKUPS_TIMEOUT: Duration = Duration::from_secs(30);
const KEEP: usize = 2;

fn backup_dir(cluster: &Cluster, id: u64) -> PathBuf {
    cluster.dir.path().join(format!("backups-{id}"))
}

/// The backup files in `dir`, by name (none if it does not exist).
fn backups(dir: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("ctrl-backup-") && name.ends_with(".ctrlbak"))
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

#[test]
fn the_leader_writes_verifies_and_prunes_backups_and_followers_do_not() {
    let mut cluster = Cluster::new(3, "");
    for id in 1..=3 {
        let config = cluster.dir.path().join(format!("node-{id}.toml"));
        let mut toml = std::fs::read_to_string(&config).unwrap();
        toml += &format!("\n[backup]\ndir = \"backups-{id}\"\ninterval_ms = 1000\nkeep = {KEEP}\n");
        std::fs::write(&config, toml).unwrap();
    }
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    let leader = cluster.settled(&[1, 2, 3]);
    let term = row_of(&cluster.status(&all), leader)["term"].clone();

    // Files come and go: at least KEEP + 1 written, never more than KEEP
    // left once the next is written.
    let dir = backup_dir(&cluster, leader);
    let deadline = Instant::now() + BACKUPS_TIMEOUT;
    let mut seen = BTreeSet::new();
    let left = loop {
        let now = backups(&dir);
        seen.extend(now.iter().cloned());
        let first = seen.iter().next().cloned();
        if seen.len() > KEEP && now.len() == KEEP && first.is_some_and(|f| !now.contains(&f)) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the leader did not write and prune backups: seen {seen:?}, now {now:?}"
        );
        std::thread::sleep(POLL_INTERVAL);
    };
    for name in &left {
        assert!(name.ends_with(&format!("-n{leader}.ctrlbak")), "{name}");
        let path = dir.join(name);
        let out = cluster.ctrl_ok(&all, &["backup", "verify", path.to_str().unwrap()]);
        assert!(!out.is_empty());
    }

    // The same leader all along (no other node led, so none may have
    // written), and the followers wrote nothing.
    let rows = cluster.status(&all);
    assert_eq!(row_of(&rows, leader)["role"], "leader");
    assert_eq!(row_of(&rows, leader)["term"], term);
    for id in (1..=3).filter(|id| *id != leader) {
        let written = backups(&backup_dir(&cluster, id));
        assert!(written.is_empty(), "follower {id} wrote {written:?}");
    }
}
