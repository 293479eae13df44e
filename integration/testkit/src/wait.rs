//! Bounded waits: [`bounded`] puts a whole test under a time limit,
//! [`within`] one named step of it, and [`wait_until`] re-checks a
//! condition until a deadline, for the few states no event announces
//! (a compaction floor, a log line, a replica's hash).
//!
//! Prefer awaiting an event where the code offers one: the simulator's
//! `Simulator::wait_until` (woken by every change), a krane's status
//! channel (`integration::fleet::Region::wait_krane`), a node's applied-pk
//! or Raft metrics channels, the node's long-poll deployment call
//! (`integration::kit::operator::Operator::wait_deployment`), and a
//! child's output ([`crate::process::Start::ready_on`]).

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::Instant;

/// Pause between two checks of a [`wait_until`] condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Runs a whole test, failing it (a panic) if it takes longer than
/// `timeout`.
pub async fn bounded<T>(timeout: Duration, test: impl Future<Output = T>) -> T {
    within(timeout, "the test", test).await
}

/// Runs one step, failing (a panic naming `what`) if it takes longer than
/// `timeout`.
pub async fn within<T>(timeout: Duration, what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, step).await {
        Ok(out) => out,
        Err(_) => panic!("{what} took longer than {timeout:?}"),
    }
}

/// Checks `condition` every [`POLL_INTERVAL`] until it returns `Ok` (what
/// was waited for), or fails once `deadline` passes, naming `what` and the
/// last `Err` (what was seen instead).
pub async fn wait_until<T, S: Debug>(
    deadline: Instant,
    what: &str,
    mut condition: impl AsyncFnMut() -> Result<T, S>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        let seen = match condition().await {
            Ok(reached) => return Ok(reached),
            Err(seen) => seen,
        };
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "waited {:?} for {what}; last seen: {seen:#?}",
                now - started
            );
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_is_checked_until_it_holds() {
        let mut checks = 0;
        let reached = wait_until(
            Instant::now() + Duration::from_secs(1),
            "the third check",
            async || {
                checks += 1;
                if checks == 3 { Ok(checks) } else { Err(checks) }
            },
        )
        .await
        .unwrap();
        assert_eq!(reached, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_fails_naming_what_and_the_last_state() {
        let error = wait_until(
            Instant::now() + Duration::from_millis(100),
            "a floor of 7",
            async || Err::<(), _>(5),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(error.contains("a floor of 7"), "{error}");
        assert!(error.contains("last seen: 5"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the step took longer than")]
    async fn a_step_past_its_bound_fails() {
        within(
            Duration::from_millis(10),
            "the step",
            std::future::pending::<()>(),
        )
        .await;
    }
}
