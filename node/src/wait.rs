//! Waiting for a deployment to become ready (`ctrl deploy --wait`): the
//! deployment's view handed to the caller's progress callback at every
//! change, until it is ready, fails, or the time is up (the CLI draws
//! per-region bars from it; the library draws nothing). A failure names
//! the regions short of their replicas and the state of their pods.
//!
//! The callback runs when the deployment changes: each
//! `OperatorRequest::WaitDeployment` call is answered by the node as soon
//! as the view differs from the one drawn (or after a bounded wait). A
//! node of an older release, which does not know that call, is read every
//! [`POLL_INTERVAL_MS`] instead. [`Follow`] does the same for the other
//! long polls (a sentinel's deploy, the latest rollout).

use std::time::Duration;

use wire::ErrorCode;
use wire::model::{DeploymentStatus, InstanceStatus};
use wire::operator::request::{GetDeployment, WaitDeployment};
use wire::operator::{DEPLOYMENT_WAIT_MS_MAX, DeploymentView};

use crate::client::{Client, ClientError};

/// How often the deployment is read from a node that does not answer
/// `WaitDeployment`.
pub const POLL_INTERVAL_MS: u64 = 100;

/// The deployment did not become ready.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The call to the cluster failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The deployment failed or was stopped.
    #[error("{deployment_id} is {status}: {shortfall}")]
    Ended {
        /// The deployment waited for.
        deployment_id: String,
        /// Its final status.
        status: &'static str,
        /// What was missing (regions short of replicas, failing pods).
        shortfall: String,
    },
    /// The deployment was not ready in time.
    #[error("{deployment_id} not ready after {timeout_s} s: {shortfall}")]
    Timeout {
        /// The deployment waited for.
        deployment_id: String,
        /// How long the wait was, in seconds.
        timeout_s: u64,
        /// What was still missing.
        shortfall: String,
    },
}

/// Waits until `deployment_id` is ready, calling `progress` with the
/// deployment as first read and after every change (the CLI draws its
/// progress bars there; a caller that shows nothing passes `|_| {}`).
pub async fn until_ready(
    client: &Client,
    deployment_id: &str,
    timeout_s: u64,
    mut progress: impl FnMut(&DeploymentView),
) -> Result<DeploymentView, WaitError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_s);
    let mut view = read(client, deployment_id).await?;
    let mut long_poll = true;
    loop {
        progress(&view);
        let d = &view.deployment;
        match d.status {
            DeploymentStatus::Ready => return Ok(view),
            DeploymentStatus::Failed
            | DeploymentStatus::Stopped
            | DeploymentStatus::Cancelled
            | DeploymentStatus::Superseded => {
                return Err(WaitError::Ended {
                    deployment_id: deployment_id.to_string(),
                    status: d.status.as_str(),
                    // The workflow's own reason names the regions and pods.
                    shortfall: d
                        .workflow
                        .reason
                        .clone()
                        .unwrap_or_else(|| shortfall(&view)),
                });
            }
            DeploymentStatus::Pending
            | DeploymentStatus::Deploying
            | DeploymentStatus::Network
            | DeploymentStatus::Finalizing => {}
        }
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            return Err(WaitError::Timeout {
                deployment_id: deployment_id.to_string(),
                timeout_s,
                shortfall: shortfall(&view),
            });
        }
        if long_poll {
            let wait_ms = long_poll_ms(remaining, client.request_timeout_ms());
            match changed(client, deployment_id, view.digest(), wait_ms).await {
                Ok(next) => view = next,
                // An older node: it cannot decode the call.
                Err(WaitError::Client(ClientError::Server(e))) if e.code == ErrorCode::BadFrame => {
                    long_poll = false;
                }
                Err(e) => return Err(e),
            }
        } else {
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
            view = read(client, deployment_id).await?;
        }
    }
}

/// How long one `WaitDeployment` may wait on the node: what is left of
/// the caller's time, within the protocol's limit, and within half the
/// client's call timeout (so the answer arrives before the call gives up).
pub fn long_poll_ms(remaining: Duration, request_timeout_ms: u64) -> u64 {
    let remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
    let cap = (request_timeout_ms / 2).clamp(1, DEPLOYMENT_WAIT_MS_MAX);
    remaining_ms.clamp(1, cap)
}

/// One `WaitDeployment` call: the deployment once its view's digest
/// differs from `seen`, or as it is after `wait_ms`.
pub async fn changed(
    client: &Client,
    id: &str,
    seen: u64,
    wait_ms: u64,
) -> Result<DeploymentView, WaitError> {
    let request = WaitDeployment {
        id: id.to_string(),
        seen,
        wait_ms,
    };
    Ok(client.call(request).await?)
}

/// A long poll followed call after call: each [`Follow::next`] sends the
/// long-poll call (`WaitSentinel`, `WaitRollout`) built from the digest of
/// what the caller has; once a node answers `bad_frame` (an older release
/// that does not know the call) it reads with the plain call every
/// `poll_ms` instead.
#[derive(Debug)]
pub struct Follow {
    long_poll: bool,
    poll_ms: u64,
}

impl Follow {
    /// Long polls first; plain reads every `poll_ms` on an older node.
    pub fn new(poll_ms: u64) -> Follow {
        Follow {
            long_poll: true,
            poll_ms,
        }
    }

    /// The next answer: `long(wait_ms)`'s, or after `poll_ms`, `read`'s.
    pub async fn next<T, L, R>(
        &mut self,
        client: &Client,
        long: impl FnOnce(u64) -> L,
        read: R,
    ) -> Result<T, ClientError>
    where
        L: wire::operator::Operation<Answer = T>,
        R: wire::operator::Operation<Answer = T>,
    {
        if self.long_poll {
            let wait_ms = long_poll_ms(Duration::MAX, client.request_timeout_ms());
            match client.call(long(wait_ms)).await {
                Err(ClientError::Server(e)) if e.code == ErrorCode::BadFrame => {
                    self.long_poll = false;
                }
                answer => return answer,
            }
        }
        tokio::time::sleep(Duration::from_millis(self.poll_ms)).await;
        client.call(read).await
    }
}

async fn read(client: &Client, id: &str) -> Result<DeploymentView, WaitError> {
    Ok(client.call(GetDeployment { id: id.to_string() }).await?)
}

/// How many of `region`'s instances of the deployment are running.
pub fn running(view: &DeploymentView, region: &str) -> usize {
    view.instances
        .iter()
        .filter(|i| i.region == region && i.status == InstanceStatus::Running)
        .count()
}

/// "us-east 1/3 running (web-1 pending: ImagePullBackOff); eu-west no instances reported"
pub fn shortfall(view: &DeploymentView) -> String {
    let d = &view.deployment;
    let mut parts = Vec::new();
    for region in &d.regions {
        let ready = running(view, region);
        if ready >= d.replicas as usize {
            continue;
        }
        let others: Vec<String> = view
            .instances
            .iter()
            .filter(|i| &i.region == region && i.status != InstanceStatus::Running)
            .map(|i| match &i.reason {
                Some(reason) => format!("{} {}: {reason}", i.pod_name, i.status.as_str()),
                None => format!("{} {}", i.pod_name, i.status.as_str()),
            })
            .collect();
        if view.instances.iter().all(|i| &i.region != region) {
            parts.push(format!(
                "{region} has no instances reported (is its krane running?)"
            ));
        } else if others.is_empty() {
            parts.push(format!("{region} {ready}/{} running", d.replicas));
        } else {
            parts.push(format!(
                "{region} {ready}/{} running ({})",
                d.replicas,
                others.join(", ")
            ));
        }
    }
    if parts.is_empty() {
        "every region runs its replicas".into()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_poll_fits_the_time_left_the_call_timeout_and_the_protocol() {
        let secs = Duration::from_secs;
        assert_eq!(
            long_poll_ms(secs(30), 5_000),
            2_500,
            "half the call timeout"
        );
        assert_eq!(
            long_poll_ms(Duration::from_millis(700), 5_000),
            700,
            "the time left"
        );
        assert_eq!(
            long_poll_ms(secs(3_600), 1_000_000),
            DEPLOYMENT_WAIT_MS_MAX,
            "the protocol's limit"
        );
        assert_eq!(long_poll_ms(Duration::from_micros(10), 5_000), 1, "never 0");
        assert_eq!(long_poll_ms(secs(30), 1), 1, "never 0");
    }
}
