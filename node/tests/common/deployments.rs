//! Waiting for the leader's deploy workflow to start a deployment: a
//! `CreateDeployment` writes the deployment `pending` and no change rows;
//! the workflow then starts it in a Raft entry of its own, writing per
//! region its topology, its environment's sentinel (the first time) and
//! its policy. Tests that count change rows wait for that start.
//!
//! The wait is a long poll (`WaitDeployment`, answered when the
//! deployment's view changes), through the library client, bounded by
//! [`STARTED_TIMEOUT`].

use std::path::Path;
use std::time::{Duration, Instant};

use config::{ConfigFile, OperatorConfig};
use node::client::{Client, ClientError};
use node::wait::WaitError;
use wire::ErrorCode;
use wire::model::DeploymentStatus;
use wire::operator::DeploymentView;

/// Bound on the workflow starting a deployment once it is created.
pub(crate) const STARTED_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before asking again when the node answering does not hold the
/// deployment yet (a follower a little behind); every other wait is a
/// long poll.
const NOT_FOUND_RETRY: Duration = Duration::from_millis(50);

/// Waits until deployment `id` has left `pending` (the workflow started
/// it), asking the nodes of the operator config at `operator`; returns
/// its view then.
///
/// # Panics
/// When the config cannot be loaded, a call fails, or the deployment is
/// still pending after [`STARTED_TIMEOUT`].
pub(crate) fn wait_started(operator: &Path, id: &str) -> DeploymentView {
    let config = OperatorConfig::load(operator)
        .unwrap_or_else(|e| panic!("operator config {}: {e}", operator.display()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the wait");
    runtime.block_on(async {
        // Inside the runtime: the client binds its endpoint on creation.
        let client = Client::new(&config).expect("operator client");
        let deadline = Instant::now() + STARTED_TIMEOUT;
        // No view has digest 0 in practice: the first call answers at once.
        let mut seen = 0;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            assert!(
                !remaining.is_zero(),
                "deployment {id} still pending after {STARTED_TIMEOUT:?}"
            );
            let wait_ms = node::wait::long_poll_ms(remaining, client.request_timeout_ms());
            match node::wait::changed(&client, id, seen, wait_ms).await {
                Ok(view) if view.deployment.status != DeploymentStatus::Pending => return view,
                Ok(view) => seen = view.digest(),
                Err(WaitError::Client(ClientError::Server(e))) if e.code == ErrorCode::NotFound => {
                    tokio::time::sleep(NOT_FOUND_RETRY.min(remaining)).await;
                }
                Err(e) => panic!("waiting for deployment {id} to start: {e}"),
            }
        }
    })
}
