//! The workflow driver as a leader job: once this node, as leader, has
//! applied an entry of its own term (so its state holds everything its
//! predecessors committed), it runs the workflows (`crate::workflow`) until
//! it stops leading. The time it took over is the start of the leader's
//! grace, during which no deadline fires.

use std::sync::Arc;

use openraft::ServerState;
use tracing::info;

use crate::replica::NodeState;
use crate::workflow::deploy::DeployWorkflow;
use crate::workflow::rollout::RolloutWorkflow;
use crate::workflow::sentinel::SentinelDeployWorkflow;
use crate::workflow::{Round, driver};

/// Runs the workflows while this node leads.
pub async fn run(state: Arc<NodeState>) {
    caught_up(&state).await;
    let leader_since_ms = state.clock.now_ms();
    info!(leader_since_ms, "workflow driver started");
    let workflows: Vec<Box<dyn Round>> = vec![
        Box::new(DeployWorkflow::new(state.deploy.clone(), leader_since_ms)),
        Box::new(SentinelDeployWorkflow::new(
            leader_since_ms,
            state.deploy.leader_grace_ms,
        )),
        Box::new(RolloutWorkflow),
    ];
    driver::drive(&workflows, state.as_ref(), state.clock.as_ref()).await;
}

/// Returns once this node leads and has applied an entry of its own term
/// (its state then holds everything its predecessors committed); never,
/// if Raft stops first.
pub async fn caught_up(state: &NodeState) {
    let mut metrics = state.raft.metrics();
    loop {
        let caught_up = {
            let m = metrics.borrow_and_update();
            m.state == ServerState::Leader
                && m.last_applied
                    .is_some_and(|id| id.leader_id.term == m.current_term)
        };
        if caught_up {
            break;
        }
        if metrics.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
