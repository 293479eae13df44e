//! What every batch commits besides its mutations: the pk counter
//! (`last_pk`), the compaction floor (`floor_pk`), the journal's sequence
//! number, the applied time (`stamp_ms`), and the Raft applied log
//! id and membership (opaque bytes from the caller). They are read once
//! when the batch starts and written once when it ends, in the batch's
//! transaction, so the applied index is always committed with the state it
//! describes.

use super::{Applier, WriteTables};
use crate::command::{ClusterIdentity, MutationResult, Outcome, RaftMeta};
use crate::error::Result;
use crate::tables::{self, DELIVERIES_MAX, load_raw, meta};

impl<'t> Applier<'t> {
    /// Starts a batch: reads the counters the batch continues from.
    pub(super) fn new(t: WriteTables<'t>, requests_max: u64) -> Result<Self> {
        let meta_u64 = |key: &'static str| -> Result<u64> {
            match load_raw(&t.metadata, key)? {
                Some(bytes) => tables::decode_u64(key, &bytes),
                None => Ok(0),
            }
        };
        let last_pk = meta_u64(meta::LAST_PK)?;
        let floor_pk = meta_u64(meta::FLOOR_PK)?;
        let journal_seq = meta_u64(meta::JOURNAL_SEQ)?;
        let stamp_ms = meta_u64(meta::STAMP_MS)?;
        Ok(Applier {
            t,
            last_pk,
            floor_pk,
            journal_seq,
            now_ms: stamp_ms,
            stamp_ms,
            caller: None,
            requests_max,
            deliveries_max: DELIVERIES_MAX,
            counts: crate::counts::CountDelta::default(),
            touched: std::collections::BTreeSet::new(),
        })
    }

    /// Ends a batch: writes the counters and the Raft metadata after its
    /// last entry.
    pub(super) fn finish(&mut self, raft: &RaftMeta) -> Result<()> {
        self.t.put_meta_u64(meta::LAST_PK, self.last_pk)?;
        self.t.put_meta_u64(meta::FLOOR_PK, self.floor_pk)?;
        self.t.put_meta_u64(meta::JOURNAL_SEQ, self.journal_seq)?;
        self.t.put_meta_u64(meta::STAMP_MS, self.stamp_ms)?;
        self.t.put_raft_meta(raft)
    }
}

impl Applier<'_> {
    /// [`crate::Mutation::SetClusterIdentity`]: written only if the cluster
    /// has none (the identity never changes through Raft); epoch 0 is
    /// refused (it means "unknown" on the wire).
    pub(super) fn set_cluster_identity(
        &mut self,
        identity: &ClusterIdentity,
    ) -> Result<MutationResult> {
        if identity.epoch == 0 {
            return Ok(super::bad_request("a cluster epoch is never 0"));
        }
        if load_raw(&self.t.metadata, meta::CLUSTER_IDENTITY)?.is_none() {
            self.t.put_cluster_identity(identity)?;
        }
        Ok(Ok(Outcome::Recorded))
    }
}
