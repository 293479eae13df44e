//! Test support: the application layer's seams over an in-memory store,
//! without Raft. [`MemoryNode`] applies every proposal at once, as one
//! command stamped with its fixed time, and counts applies as the applied
//! mark; its clock is fixed in time and counts its randomness, so ids
//! minted in the same millisecond still differ.
//!
//! It uses nothing of the application layer but its seams, so every module
//! of it (and every layer above) may test with it; a deployment created
//! and started is `deployments::testing`'s.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use storage::mutations;

use storage::{Command, Mutation, MutationResult, RaftMeta, ReadView, StorageError, Store};
use tokio::sync::watch;
use wire::WireError;
use wire::operator::CreateDeployment;

use super::{Propose, ReadState, internal};
use crate::clock::Clock;

/// The time of [`MemoryNode`]'s clock.
pub(crate) const NOW_MS: u64 = 7;

/// Always [`NOW_MS`]; randomness counts up from 1.
#[derive(Default)]
pub(crate) struct CountingClock {
    random: AtomicU64,
}

impl wire::clock::Clock for CountingClock {
    fn now_ms(&self) -> u64 {
        NOW_MS
    }
}

impl Clock for CountingClock {
    fn random_u64(&self) -> u64 {
        self.random.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Always the time it holds, and randomness 0.
pub(crate) struct FixedTimeClock(pub(crate) u64);

impl wire::clock::Clock for FixedTimeClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

impl Clock for FixedTimeClock {
    fn random_u64(&self) -> u64 {
        0
    }
}

/// The regions [`MemoryNode::new`] has registered.
pub(crate) const TEST_REGIONS: [&str; 2] = ["eu-west", "us-east"];

/// An in-memory store behind both seams.
pub(crate) struct MemoryNode {
    store: Store,
    clock: CountingClock,
    /// The number of applies so far: the applied mark.
    applied: watch::Sender<u64>,
    proposals: AtomicUsize,
    keyring: transport::sealing::Keyring,
    /// Added to [`NOW_MS`] in the commands proposed ([`MemoryNode::advance_ms`]).
    offset_ms: AtomicU64,
    /// Long polls' wake-ups by record, as a node's state machine feeds them.
    wake: crate::wake::KeyedWake,
}

/// The secrets key of [`MemoryNode`] (a test key, never a real one).
pub(crate) const TEST_SECRETS_KEY: &str =
    "k1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

impl MemoryNode {
    /// A node with [`TEST_REGIONS`] registered, as an operator registers
    /// regions before deploying to them.
    pub(crate) fn new() -> MemoryNode {
        MemoryNode::with_regions(&TEST_REGIONS)
    }

    /// A node with exactly `regions` registered (schedulable). The
    /// registration is set-up: it is neither a proposal nor an apply of
    /// the applied mark.
    pub(crate) fn with_regions(regions: &[&str]) -> MemoryNode {
        let store = Store::in_memory().expect("an in-memory store");
        let command = Command {
            now_ms: NOW_MS,
            mutations: regions
                .iter()
                .map(|name| {
                    Mutation::AddRegion(mutations::AddRegion {
                        name: name.to_string(),
                    })
                })
                .collect(),
        };
        let meta = RaftMeta {
            last_applied: 0u64.to_le_bytes().to_vec(),
            membership: Vec::new(),
        };
        let applied = store
            .apply(&[Some(&command)], &meta, false)
            .expect("registering the test regions");
        assert!(
            applied.outcomes.iter().flatten().all(Result::is_ok),
            "{applied:?}"
        );
        MemoryNode {
            store,
            wake: crate::wake::KeyedWake::default(),
            clock: CountingClock::default(),
            applied: watch::Sender::new(0),
            proposals: AtomicUsize::new(0),
            offset_ms: AtomicU64::new(0),
            keyring: transport::sealing::Keyring::parse(
                std::path::Path::new("test.key"),
                TEST_SECRETS_KEY,
            )
            .expect("the test key parses"),
        }
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    pub(crate) fn now_ms(&self) -> u64 {
        NOW_MS + self.offset_ms.load(Ordering::Relaxed)
    }

    /// Moves the time stamped into later proposals `ms` ahead.
    pub(crate) fn advance_ms(&self, ms: u64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Commands proposed so far.
    pub(crate) fn proposals(&self) -> usize {
        self.proposals.load(Ordering::Relaxed)
    }
}

impl Propose for MemoryNode {
    async fn propose(&self, mutations: Vec<Mutation>) -> Result<Vec<MutationResult>, WireError> {
        self.proposals.fetch_add(1, Ordering::Relaxed);
        let command = Command {
            now_ms: self.now_ms(),
            mutations,
        };
        let index = *self.applied.borrow() + 1;
        let meta = RaftMeta {
            last_applied: index.to_le_bytes().to_vec(),
            membership: Vec::new(),
        };
        let applied = self
            .store
            .apply(&[Some(&command)], &meta, false)
            .map_err(internal)?;
        self.wake.wake(&applied.touched);
        self.applied.send_replace(index);
        Ok(applied.outcomes.into_iter().next().unwrap_or_default())
    }
}

impl ReadState for MemoryNode {
    fn read(&self) -> Result<ReadView, StorageError> {
        self.store.read()
    }

    fn applied_mark(&self) -> Option<u64> {
        Some(*self.applied.borrow())
    }

    fn take_touched(&self) -> storage::TouchedSet {
        self.store.take_touched()
    }

    fn subscribe_touched(&self, key: &storage::command::Touched) -> Option<watch::Receiver<u64>> {
        Some(self.wake.subscribe(key))
    }

    fn keyring(&self) -> Option<&transport::sealing::Keyring> {
        Some(&self.keyring)
    }

    async fn applied_past(&self, mark: Option<u64>, wait: Duration) -> bool {
        let mut applied = self.applied.subscribe();
        let past = applied.wait_for(|index| Some(*index) > mark);
        matches!(tokio::time::timeout(wait, past).await, Ok(Ok(_)))
    }
}

/// A valid create of one small replica per region.
pub(crate) fn create_request(regions: &[&str]) -> CreateDeployment {
    CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: "nginx:1.27".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        env_vars: BTreeMap::new(),
        progress_deadline_ms: None,
        min_ready_regions: None,
        spec: Default::default(),
    }
}
