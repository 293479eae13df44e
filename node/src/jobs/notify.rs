//! The delivery job: while this node leads (and has applied an entry of
//! its term, so it sees every delivery its predecessors recorded), it
//! POSTs the pending deliveries that are due, at most
//! `notify.in_flight_max` at once, each attempt in a task of its own, and
//! records each attempt's result with a guarded Raft write
//! (`Mutation::Deliver`). Then it waits for the next apply (a new event,
//! a replay, its own records) or the earliest next attempt.
//!
//! At least once: a delivery is recorded only after its POST answered, so
//! a leader that dies in between leaves it pending and the next leader
//! sends it again, with the same event id. A slow or failing endpoint
//! holds only its own attempts (bounded by the request timeout); it never
//! blocks a workflow, which records its transitions without waiting for
//! any delivery.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use config::NotifySettings;
use storage::Outcome;
use storage::command::{DeliveryAction, DeliveryTransition, Mutation};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};
use wire::notify::{Delivery, NotifyEndpoint};
use wire::rules::notify::delivery_guard;

use crate::app::{Propose, ReadState};
use crate::notify::decide;
use crate::notify::send::Sender;
use crate::replica::NodeState;

/// Most pending deliveries one round reads (the earliest due first).
pub const PENDING_SCAN_MAX: usize = 1_024;
/// Longest wait between two rounds with nothing due: a safety net.
pub const IDLE_WAIT_MS: u64 = 60_000;
/// Shortest wait between two rounds, so a past due time cannot spin.
pub const ROUND_WAIT_MIN_MS: u64 = 10;

/// Delivers notifications while this node leads.
pub async fn run(state: Arc<NodeState>, settings: NotifySettings) {
    super::workflows::caught_up(&state).await;
    let sender = match Sender::new(Duration::from_millis(settings.request_timeout_ms)) {
        Ok(sender) => sender,
        Err(e) => {
            warn!("webhook deliveries are off: no TLS client config ({e})");
            return;
        }
    };
    info!("delivery job started");
    let mut in_flight: JoinSet<u64> = JoinSet::new();
    let mut sending: HashSet<u64> = HashSet::new();
    let mut dropped_seen: Option<u64> = None;
    loop {
        let mark = state.applied_mark();
        let now_ms = state.clock.now_ms();
        let (due, wake_at_ms, dropped) = match read(state.as_ref(), &sending, now_ms) {
            Ok(read) => read,
            Err(e) => {
                warn!("delivery job cannot read the state: {e}");
                (Vec::new(), None, None)
            }
        };
        if let Some(dropped) = dropped {
            if dropped_seen.is_some_and(|seen| dropped > seen) {
                warn!(
                    dropped,
                    "notifications were dropped: the delivery table is full of undelivered ones"
                );
            }
            dropped_seen = Some(dropped);
        }
        let room = settings.in_flight_max.saturating_sub(in_flight.len());
        for (delivery, endpoint) in due.into_iter().take(room) {
            sending.insert(delivery.id);
            let (state, sender, settings) = (state.clone(), sender.clone(), settings.clone());
            in_flight.spawn(async move {
                let result = sender.send(&endpoint, &delivery).await;
                if let Err(e) = &result {
                    debug!(
                        delivery = delivery.id,
                        event = delivery.event_id,
                        endpoint = %endpoint.name,
                        "delivery attempt failed: {e}"
                    );
                }
                let now_ms = state.clock.now_ms();
                let recorded = record(state.as_ref(), &settings, &delivery, result, now_ms).await;
                if let Some(result) = recorded {
                    state.metrics.notify_attempted(result);
                }
                delivery.id
            });
        }
        let wait_ms = wake_at_ms
            .map_or(IDLE_WAIT_MS, |at_ms| at_ms.saturating_sub(now_ms))
            .clamp(ROUND_WAIT_MIN_MS, IDLE_WAIT_MS);
        tokio::select! {
            Some(done) = in_flight.join_next() => match done {
                Ok(id) => {
                    sending.remove(&id);
                }
                Err(e) => {
                    // A task that panicked: forget every id so the ones
                    // still pending are tried again.
                    warn!("a delivery attempt failed: {e}");
                    sending.clear();
                }
            },
            _ = state.applied_past(mark, Duration::from_millis(wait_ms)) => {}
        }
    }
}

/// The deliveries due now and not being sent, with their endpoints; the
/// earliest due time of the others; the dropped count.
#[allow(clippy::type_complexity)]
fn read(
    state: &impl ReadState,
    sending: &HashSet<u64>,
    now_ms: u64,
) -> Result<(Vec<(Delivery, NotifyEndpoint)>, Option<u64>, Option<u64>), storage::StorageError> {
    let view = state.read()?;
    let endpoints: BTreeMap<String, NotifyEndpoint> = view
        .notify_endpoints()?
        .into_iter()
        .map(|e| (e.name.clone(), e))
        .collect();
    let mut due = Vec::new();
    let mut wake_at_ms = None;
    for delivery in view.pending_deliveries(PENDING_SCAN_MAX)? {
        if sending.contains(&delivery.id) {
            continue;
        }
        if delivery.next_attempt_at_ms > now_ms {
            wake_at_ms = Some(delivery.next_attempt_at_ms);
            break;
        }
        // A pending delivery's endpoint exists: removing one kills them.
        if let Some(endpoint) = endpoints.get(&delivery.endpoint) {
            due.push((delivery, endpoint.clone()));
        }
    }
    Ok((due, wake_at_ms, Some(view.notify_dropped())))
}

/// Records an attempt's `result` on `delivery`, ended at `now_ms` (the
/// leader's time), guarded by the version of the delivery it was sent
/// from. What was recorded (`delivered`, `failed`, `dead`), `None` if
/// nothing was (not committed, or the guard no longer held).
pub async fn record(
    state: &impl Propose,
    settings: &NotifySettings,
    delivery: &Delivery,
    result: Result<(), String>,
    now_ms: u64,
) -> Option<&'static str> {
    let action = decide(delivery, result, settings, now_ms);
    let label = match &action {
        DeliveryAction::Delivered => "delivered",
        DeliveryAction::Failed { .. } => "failed",
        DeliveryAction::GaveUp { .. } => "dead",
    };
    let mutation = Mutation::Deliver(DeliveryTransition {
        delivery_id: delivery.id,
        expected: delivery_guard(delivery),
        action,
    });
    match state.propose(vec![mutation]).await {
        Ok(outcomes) if matches!(outcomes.as_slice(), [Ok(Outcome::Recorded)]) => Some(label),
        Ok(outcomes) => {
            debug!(
                delivery = delivery.id,
                "a delivery attempt not recorded: {outcomes:?}"
            );
            None
        }
        Err(e) => {
            // Not committed: the delivery stays pending and is sent again.
            warn!(
                delivery = delivery.id,
                "cannot record a delivery attempt: {e}"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use wire::notify::AddEndpoint;

    use super::*;
    use crate::app::deployments::testing::failed_deploy;
    use crate::app::testing::{MemoryNode, NOW_MS};

    fn settings() -> NotifySettings {
        NotifySettings {
            backoff_initial_ms: 1_000,
            ..NotifySettings::default()
        }
    }

    #[tokio::test]
    async fn a_round_takes_the_due_deliveries_not_being_sent_and_wakes_at_the_next() {
        let node = MemoryNode::new();
        let add = AddEndpoint {
            name: "chat".into(),
            url: "http://127.0.0.1:9/hook".into(),
            secret: None,
        };
        crate::app::notify::add(&node, add).await.unwrap();
        failed_deploy(&node).await;
        let (due, wake, dropped) = read(&node, &HashSet::new(), NOW_MS).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!((wake, dropped), (None, Some(0)));
        let (delivery, endpoint) = &due[0];
        assert_eq!(endpoint.name, "chat");

        // Being sent: not taken again.
        let sending = HashSet::from([delivery.id]);
        assert!(read(&node, &sending, NOW_MS).unwrap().0.is_empty());

        // A failure moves it to the backoff: not due now, the wake time.
        let recorded = record(&node, &settings(), delivery, Err("HTTP 500".into()), NOW_MS).await;
        assert_eq!(recorded, Some("failed"));
        let (due, wake, _) = read(&node, &HashSet::new(), NOW_MS).unwrap();
        assert!(due.is_empty());
        assert_eq!(wake, Some(NOW_MS + 1_000));
        let (due, _, _) = read(&node, &HashSet::new(), NOW_MS + 1_000).unwrap();
        assert_eq!(due[0].0.attempts, 1);

        // A result decided on the old version changes nothing.
        let recorded = record(&node, &settings(), delivery, Ok(()), NOW_MS).await;
        assert_eq!(recorded, None, "the guard no longer holds");
        let again = node.read().unwrap().delivery(delivery.id).unwrap().unwrap();
        assert_eq!(again.state, wire::notify::DeliveryState::Pending);
        record(&node, &settings(), &again, Ok(()), NOW_MS + 1_000).await;
        let done = node.read().unwrap().delivery(delivery.id).unwrap().unwrap();
        assert_eq!(done.state, wire::notify::DeliveryState::Delivered);
        assert!(read(&node, &HashSet::new(), u64::MAX).unwrap().0.is_empty());
    }

    /// A receiver answering every POST 204; each body, in arrival order,
    /// on the channel.
    async fn receiver() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            let tx = tx.clone();
                            async move {
                                let body = request.into_body().collect().await?.to_bytes();
                                let _ = tx.send(body.to_vec());
                                let mut response = hyper::Response::new(http_body_util::Full::new(
                                    bytes::Bytes::new(),
                                ));
                                *response.status_mut() = hyper::StatusCode::NO_CONTENT;
                                Ok::<_, hyper::Error>(response)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, rx)
    }

    /// Every notification of a rollout — started, each wave started and
    /// completed, completed — not only the first, is delivered to the
    /// endpoint it was started with, by the job's read and record.
    #[tokio::test]
    async fn every_notification_of_a_rollout_reaches_the_receiver() {
        use wire::model::{DesiredState, Health, Sentinel, SentinelDeploy, SentinelStatus};
        use wire::rollout::{RolloutOptions, RolloutState};

        use crate::app::testing::FixedTimeClock;
        use crate::workflow::Round;
        use crate::workflow::driver::round;
        use crate::workflow::rollout::RolloutWorkflow;
        use crate::workflow::sentinel::SentinelDeployWorkflow;

        let node = MemoryNode::new();
        let (addr, mut bodies) = receiver().await;
        let add = AddEndpoint {
            name: "chat".into(),
            url: format!("http://{addr}/hook"),
            secret: None,
        };
        crate::app::notify::add(&node, add).await.unwrap();
        let sentinels = (0..2)
            .map(|i| {
                Mutation::UpsertSentinel(Sentinel {
                    id: format!("snt_{i}"),
                    workspace_id: "ws".into(),
                    project_id: "proj".into(),
                    app_id: "app".into(),
                    environment_id: format!("env_{i}"),
                    region: "us-east".into(),
                    k8s_name: format!("snt-{i}"),
                    k8s_namespace: "sentinel".into(),
                    image: "sentinel:1".into(),
                    cpu_millicores: 100,
                    memory_mib: 128,
                    replicas: 1,
                    desired_state: DesiredState::Running,
                    version: 0,
                    created_at_ms: 0,
                    updated_at_ms: 0,
                    deploy: SentinelDeploy::default(),
                })
            })
            .collect();
        node.propose(sentinels).await.unwrap();
        let start = Mutation::StartRollout(RolloutOptions {
            image: "sentinel:2".into(),
            wave_percents: vec![50, 100],
            bake_ms: 0,
            max_failures: 0,
            concurrency: 0,
            deadline_ms: 60_000,
            notify: Some("chat".into()),
        });
        let out = node.propose(vec![start]).await.unwrap();
        assert!(out.iter().all(Result::is_ok), "{out:?}");

        // The workflows and a krane converging every sentinel written.
        let flows: Vec<Box<dyn Round>> = vec![
            Box::new(SentinelDeployWorkflow::new(0, 0)),
            Box::new(RolloutWorkflow),
        ];
        let clock = FixedTimeClock(NOW_MS);
        let rollout = || node.read().unwrap().latest_rollout().unwrap().unwrap();
        for _ in 0..50 {
            if rollout().state == RolloutState::Completed {
                break;
            }
            round(&flows, &node, &clock).await;
            let view = node.read().unwrap();
            let mut reports = Vec::new();
            for s in view.sentinels(None, 100).unwrap() {
                let status = view.sentinel_status(&s.id, &s.region).unwrap();
                if status.is_some_and(|st| st.applied_version >= s.version) {
                    continue;
                }
                reports.push(Mutation::ReportSentinelStatus(SentinelStatus {
                    sentinel_id: s.id.clone(),
                    region: s.region.clone(),
                    available_replicas: s.replicas,
                    updated_replicas: s.replicas,
                    ready_replicas: s.replicas,
                    observed_generation: 1,
                    running_image: s.image.clone(),
                    health: Health::Healthy,
                    updated_at_ms: NOW_MS,
                    applied_version: s.version,
                }));
            }
            drop(view);
            if !reports.is_empty() {
                node.propose(reports).await.unwrap();
            }
        }
        assert_eq!(rollout().state, RolloutState::Completed);

        // The job's rounds: each due delivery sent and recorded.
        let sender = Sender::new(Duration::from_secs(5)).unwrap();
        let mut sent = 0;
        for _ in 0..20 {
            let (due, _, _) = read(&node, &HashSet::new(), NOW_MS).unwrap();
            if due.is_empty() {
                break;
            }
            for (delivery, endpoint) in due {
                let result = sender.send(&endpoint, &delivery).await;
                let recorded = record(&node, &settings(), &delivery, result, NOW_MS).await;
                assert_eq!(recorded, Some("delivered"), "{delivery:?}");
                sent += 1;
            }
        }
        let mut kinds = Vec::new();
        let mut event_ids = Vec::new();
        while let Ok(body) = bodies.try_recv() {
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            kinds.push(body["kind"].as_str().unwrap().to_string());
            event_ids.push(body["event_id"].as_str().unwrap().to_string());
        }
        assert_eq!(
            kinds,
            [
                "rollout.started",
                "rollout.wave_started",
                "rollout.wave_completed",
                "rollout.wave_started",
                "rollout.wave_completed",
                "rollout.completed",
            ],
            "every notification, in order"
        );
        assert_eq!(sent, kinds.len(), "one request per delivery");
        let mut unique = event_ids.clone();
        unique.dedup();
        assert_eq!(unique, event_ids, "one event id each");
        let view = node.read().unwrap();
        let all = view.deliveries(0, 100).unwrap();
        assert_eq!(all.len(), kinds.len());
        assert!(
            all.iter()
                .all(|d| d.state == wire::notify::DeliveryState::Delivered),
            "{all:#?}"
        );
    }
}
