//! The cluster identity job: once this node leads and has applied an entry
//! of its own term, it records a random cluster identity (id and epoch) if
//! the state has none — the first leader of a new cluster, or of one that
//! ran before identities existed. Apply keeps the first one recorded, so
//! two leaders racing change nothing. A restore writes a new epoch
//! offline (`ctrl restore`), never through this job.

use std::sync::Arc;
use std::time::Duration;

use storage::{ClusterIdentity, Mutation};
use tracing::{info, warn};

use super::workflows::caught_up;
use crate::replica::{NodeState, write};

/// Pause between two tries when the write fails (the job then tries again
/// until it stops leading).
pub const IDENTITY_RETRY_MS: u64 = 1_000;

/// Records the cluster's identity if it has none, then ends.
pub async fn run(state: Arc<NodeState>) {
    caught_up(&state).await;
    loop {
        let recorded = match state.store.read() {
            Ok(view) => view.cluster_identity(),
            Err(e) => {
                warn!("cannot read the cluster identity: {e}");
                None
            }
        };
        if recorded.is_some() {
            return;
        }
        let identity = new_identity(state.clock.as_ref());
        match write::propose(&state, vec![Mutation::SetClusterIdentity(identity)]).await {
            Ok(_) => {
                info!(
                    cluster_id = %format!("{:032x}", identity.cluster_id),
                    epoch = identity.epoch,
                    "recorded the cluster identity"
                );
                // Read again: the identity kept is the first one applied.
                continue;
            }
            Err(e) => warn!("cannot record the cluster identity: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(IDENTITY_RETRY_MS)).await;
    }
}

/// A random identity; the epoch is never 0.
pub fn new_identity(clock: &dyn crate::clock::Clock) -> ClusterIdentity {
    let high = u128::from(clock.random_u64());
    let low = u128::from(clock.random_u64());
    ClusterIdentity {
        cluster_id: (high << 64) | low,
        epoch: clock.random_u64().max(1),
    }
}
