//! The stream handler against a fake reconciler, fed by a
//! `wire::session::WatchServer` in memory.

use std::sync::Mutex;

use wire::session::WatchServer;

use super::*;
use crate::test_support::{topology, topology_key};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Apply(String, Pk),
    Delete(String, Option<Pk>),
    Rejected(String, Pk),
}

/// Records calls; fails every call about `failing`; holds every call
/// about `slow` until `release` is notified.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    failing: Mutex<Option<String>>,
    /// Applies of this id are refused for good (422).
    rejecting: Mutex<Option<String>>,
    /// Deletes of this id are refused for good (an admission webhook).
    refusing_delete: Mutex<Option<String>>,
    slow: Mutex<Option<String>>,
    release: tokio::sync::Notify,
    /// Sizes of the desired sets garbage collection was given.
    collected: Mutex<Vec<usize>>,
    /// The rejections reported.
    state_of_rejections: Mutex<Vec<wire::model::ApplyReport>>,
    /// Where rejections are recorded, as the controller's recorder does.
    store: Mutex<Option<std::sync::Arc<LocalState>>>,
}

impl Fake {
    fn slow_on(&self, id: Option<&str>) {
        *self.slow.lock().unwrap() = id.map(str::to_string);
    }

    async fn gate(&self, id: &str) {
        let slow = self.slow.lock().unwrap().as_deref() == Some(id);
        if slow {
            self.release.notified().await;
        }
    }

    fn fail_on(&self, id: Option<&str>) {
        *self.failing.lock().unwrap() = id.map(str::to_string);
    }

    fn reject_on(&self, id: Option<&str>) {
        *self.rejecting.lock().unwrap() = id.map(str::to_string);
    }

    /// A transient failure (503) for `failing`.
    fn check(&self, id: &str) -> Result<(), K8sError> {
        match self.failing.lock().unwrap().as_deref() {
            Some(failing) if failing == id => Err(K8sError::Client(Box::new(kube::Error::Api(
                kube::core::Status::failure(&format!("{id} fails"), "ServiceUnavailable")
                    .with_code(503)
                    .boxed(),
            )))),
            _ => Ok(()),
        }
    }

    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut self.calls.lock().unwrap())
    }
}

impl Reconciler for Fake {
    async fn apply(&self, resource: &Resource) -> Result<(), K8sError> {
        let id = resource.key().resource_id;
        self.gate(&id).await;
        self.check(&id)?;
        if self.rejecting.lock().unwrap().as_deref() == Some(id.as_str()) {
            return Err(K8sError::Invalid(format!("{id} is invalid")));
        }
        self.calls
            .lock()
            .unwrap()
            .push(Call::Apply(id, resource.version()));
        Ok(())
    }

    async fn rejected(
        &self,
        key: &ResourceKey,
        version: Pk,
        rejection: &crate::k8s::Rejection,
    ) -> Result<(), K8sError> {
        let report = wire::model::ApplyReport {
            key: key.clone(),
            version,
            outcome: wire::model::ApplyOutcome::Rejected {
                reason: rejection.reason.clone(),
                code: rejection.code,
                field: rejection.field.clone(),
            },
            at_ms: 1,
        };
        self.state_of_rejections
            .lock()
            .unwrap()
            .push(report.clone());
        self.calls
            .lock()
            .unwrap()
            .push(Call::Rejected(key.resource_id.clone(), version));
        match self.store.lock().unwrap().as_ref() {
            Some(state) => state
                .record_rejected(&report)
                .map_err(|e| K8sError::LocalState(Box::new(e))),
            None => Ok(()),
        }
    }

    async fn collect(
        &self,
        desired: &std::collections::BTreeSet<crate::controller::gc::Owner>,
    ) -> Result<usize, K8sError> {
        self.collected.lock().unwrap().push(desired.len());
        Ok(0)
    }

    async fn delete(&self, key: &ResourceKey, last: Option<&Resource>) -> Result<(), K8sError> {
        self.gate(&key.resource_id).await;
        self.check(&key.resource_id)?;
        if self.refusing_delete.lock().unwrap().as_deref() == Some(key.resource_id.as_str()) {
            return Err(K8sError::Client(Box::new(kube::Error::Api(
                kube::core::Status::failure(
                    "admission webhook \"deny.test\" denied the request: keep it",
                    "Forbidden",
                )
                .with_code(403)
                .boxed(),
            ))));
        }
        self.calls.lock().unwrap().push(Call::Delete(
            key.resource_id.clone(),
            last.map(Resource::version),
        ));
        Ok(())
    }
}

fn apply(id: &str, version: Pk) -> Call {
    Call::Apply(id.into(), version)
}

fn change(server: &mut WatchServer, version: Pk, id: &str) -> WatchEvent {
    server
        .change(version, ResourceChange::Apply(topology(id, version)))
        .unwrap()
}

fn delete(server: &mut WatchServer, version: Pk, id: &str) -> WatchEvent {
    server
        .change(version, ResourceChange::Delete(topology_key(id)))
        .unwrap()
}

/// A full sync of `items` (id, version) read at `cursor`.
fn full_sync(server: &mut WatchServer, cursor: Pk, items: &[(&str, Pk)]) -> Vec<WatchEvent> {
    let mut events = vec![server.sync_start(cursor, 0).unwrap()];
    for (id, version) in items {
        events.push(server.sync_item(topology(id, *version)).unwrap());
    }
    events.push(server.sync_end().unwrap());
    events
}

/// Locks shared by the handlers of one test.
static LOCKS: std::sync::LazyLock<KeyLocks> = std::sync::LazyLock::new(KeyLocks::default);

/// A handler applying up to 8 resources at once.
fn new_handler<'a>(
    state: &'a LocalState,
    fake: &'a Fake,
    requested: Pk,
) -> StreamHandler<'a, Fake> {
    StreamHandler::new(state, fake, &LOCKS, 8, requested)
}

/// Feeds `events`, waiting after each until its applies finished.
async fn feed(handler: &mut StreamHandler<'_, Fake>, events: Vec<WatchEvent>) -> Vec<Flow> {
    let mut flows = Vec::new();
    for event in events {
        flows.push(handler.on_event(event).await.unwrap());
        handler.settle().await.unwrap();
    }
    flows
}

/// One event, applied.
async fn step(handler: &mut StreamHandler<'_, Fake>, event: WatchEvent) -> Flow {
    let flow = handler.on_event(event).await.unwrap();
    handler.settle().await.unwrap();
    flow
}

fn applied_ids(state: &LocalState) -> Vec<(String, Pk)> {
    state
        .applied()
        .unwrap()
        .into_iter()
        .map(|(key, version, _)| (key.resource_id, version))
        .collect()
}

#[tokio::test]
async fn full_sync_then_changes() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    let fake = Fake::default();
    let mut server = WatchServer::new();
    let mut events = full_sync(&mut server, 5, &[("a", 2), ("b", 5)]);
    events.push(change(&mut server, 6, "c"));
    events.push(delete(&mut server, 7, "a"));
    events.extend(server.progress(9));

    let mut handler = new_handler(&state, &fake, 0);
    let flows = feed(&mut handler, events).await;
    assert_eq!(flows[3], Flow::Synced { cursor: 5 });
    assert_eq!(
        fake.take(),
        [
            apply("a", 2),
            apply("b", 5),
            apply("c", 6),
            Call::Delete("a".into(), Some(2))
        ]
    );
    assert_eq!(state.cursor().unwrap(), 9);
    assert_eq!(state.full_syncs().unwrap(), 1);
    assert_eq!(
        *fake.collected.lock().unwrap(),
        [2],
        "the cluster's stale objects are collected once, against the 2 synced"
    );
    assert_eq!(
        applied_ids(&state),
        [("b".to_string(), 5), ("c".to_string(), 6)]
    );
}

#[tokio::test]
async fn a_failed_apply_is_retried_from_the_stored_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    fake.fail_on(Some("b"));

    let failures = crate::heartbeat::FailedApplies::default();
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5).recording_failures(&failures);
    step(&mut handler, change(&mut server, 6, "a")).await;
    handler.on_event(change(&mut server, 7, "b")).await.unwrap();
    let error = handler.settle().await;
    assert!(matches!(error, Err(WatchError::K8s(_))), "{error:?}");
    assert_eq!(state.cursor().unwrap(), 6, "not past the failed event");
    assert_eq!(applied_ids(&state), [("a".to_string(), 6)]);
    let failed = failures.list();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].key.resource_id, "b");
    assert!(failed[0].error.contains("b fails"), "{failed:?}");

    // Reconnect: the server resumes after the stored cursor.
    fake.fail_on(None);
    let mut server = WatchServer::new();
    server.resume(state.cursor().unwrap()).unwrap();
    let mut handler =
        new_handler(&state, &fake, state.cursor().unwrap()).recording_failures(&failures);
    step(&mut handler, change(&mut server, 7, "b")).await;
    assert_eq!(state.cursor().unwrap(), 7);
    assert!(failures.list().is_empty(), "applied: no longer failing");
    assert_eq!(fake.take(), [apply("a", 6), apply("b", 7)]);
}

#[tokio::test]
async fn full_sync_collects_what_it_did_not_mention() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    for (id, version) in [("a", 1), ("b", 2), ("c", 3)] {
        state.record_synced(&topology(id, version)).unwrap();
    }
    // "resync required" reset the cursor; the snapshot is kept.
    let fake = Fake::default();
    let mut server = WatchServer::new();
    let events = full_sync(&mut server, 10, &[("b", 2), ("d", 8)]);
    let mut handler = new_handler(&state, &fake, 0);
    feed(&mut handler, events).await;
    assert_eq!(
        fake.take(),
        [
            apply("d", 8),
            Call::Delete("a".into(), Some(1)),
            Call::Delete("c".into(), Some(3)),
        ],
        "b is unchanged: not applied again"
    );
    assert_eq!(state.cursor().unwrap(), 10);
    assert_eq!(
        applied_ids(&state),
        [("b".to_string(), 2), ("d".to_string(), 8)]
    );
}

#[tokio::test]
async fn a_failed_garbage_collection_keeps_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_synced(&topology("a", 1)).unwrap();
    let fake = Fake::default();
    fake.fail_on(Some("a"));
    let mut server = WatchServer::new();
    let mut events = full_sync(&mut server, 4, &[("b", 4)]).into_iter();
    let mut handler = new_handler(&state, &fake, 0);
    handler.on_event(events.next().unwrap()).await.unwrap();
    handler.on_event(events.next().unwrap()).await.unwrap();
    assert!(handler.on_event(events.next().unwrap()).await.is_err());
    assert_eq!(state.cursor().unwrap(), 0, "the next start syncs again");
}

#[tokio::test]
async fn resync_required_resets_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    let mut handler = new_handler(&state, &fake, 5);
    let flow = handler
        .on_event(WatchServer::new().resync_required(9))
        .await
        .unwrap();
    assert_eq!(flow, Flow::Resync);
    assert_eq!(state.cursor().unwrap(), 0);
}

#[tokio::test]
async fn an_epoch_change_resets_the_cursor_and_a_sync_of_the_new_epoch_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state
        .record_applied(50, &ResourceChange::Apply(topology("a", 50)))
        .unwrap();
    state.record_sync_end(50, 3).unwrap();
    let fake = Fake::default();
    // The cluster was restored: its epoch is 4 and it is behind the cursor.
    let mut handler = new_handler(&state, &fake, 50);
    let flow = handler
        .on_event(WatchServer::new().epoch_changed(4).unwrap())
        .await
        .unwrap();
    assert_eq!(flow, Flow::Resync);
    assert_eq!(state.cursor().unwrap(), 0);

    // The full sync of epoch 4 at cursor 20 (behind 50) is taken whole:
    // "a" is not in it, so it is collected; the epoch is stored.
    let mut handler = new_handler(&state, &fake, 0);
    let mut server = WatchServer::new();
    let mut events = vec![server.sync_start(20, 4).unwrap()];
    events.push(server.sync_item(topology("b", 20)).unwrap());
    events.push(server.sync_end().unwrap());
    for event in events {
        handler.on_event(event).await.unwrap();
        while handler.busy() {
            handler.next_done().await.unwrap();
        }
    }
    assert_eq!((state.cursor().unwrap(), state.epoch().unwrap()), (20, 4));
    assert!(
        state
            .applied_resource(&topology_key("a"))
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_full_sync_behind_the_stored_cursor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state
        .record_applied(10, &ResourceChange::Apply(topology("a", 10)))
        .unwrap();
    let fake = Fake::default();
    // A periodic full sync (request 0, cursor kept) served by a lagging node.
    let mut server = WatchServer::new();
    let mut handler = new_handler(&state, &fake, 0);
    let result = handler.on_event(server.sync_start(7, 0).unwrap()).await;
    assert!(
        matches!(
            result,
            Err(WatchError::LaggingSync {
                sync: 7,
                stored: 10
            })
        ),
        "{result:?}"
    );
    assert_eq!(state.full_syncs().unwrap(), 0);
    assert!(fake.take().is_empty());
}

#[tokio::test]
async fn a_periodic_full_sync_keeps_the_cursor_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state
        .record_applied(10, &ResourceChange::Apply(topology("a", 10)))
        .unwrap();
    let fake = Fake::default();
    let mut server = WatchServer::new();
    let mut events = full_sync(&mut server, 12, &[("a", 10), ("b", 12)]);
    let end = events.pop().unwrap();
    let mut handler = new_handler(&state, &fake, 0);
    feed(&mut handler, events).await;
    assert_eq!(state.cursor().unwrap(), 10);
    handler.on_event(end).await.unwrap();
    assert_eq!(state.cursor().unwrap(), 12);
    assert_eq!(fake.take(), [apply("b", 12)], "a is unchanged");
}

#[tokio::test]
async fn a_full_sync_of_an_unchanged_region_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    let fake = Fake::default();
    let items: Vec<(String, Pk)> = (1..=100).map(|i| (format!("r{i:03}"), i)).collect();
    let items: Vec<(&str, Pk)> = items.iter().map(|(id, v)| (id.as_str(), *v)).collect();
    let mut handler = new_handler(&state, &fake, 0);
    feed(
        &mut handler,
        full_sync(&mut WatchServer::new(), 100, &items),
    )
    .await;
    assert_eq!(fake.take().len(), 100);

    // Resync required (or the periodic safety net): the same region again.
    state.reset_cursor().unwrap();
    let mut handler = new_handler(&state, &fake, 0);
    let flows = feed(
        &mut handler,
        full_sync(&mut WatchServer::new(), 100, &items),
    )
    .await;
    assert_eq!(flows.last(), Some(&Flow::Synced { cursor: 100 }));
    assert!(fake.take().is_empty(), "no Kubernetes writes");
    assert_eq!(state.cursor().unwrap(), 100);
    assert_eq!(state.full_syncs().unwrap(), 2);
    assert_eq!(state.applied().unwrap().len(), 100);
}

/// `id` at `version` with the secret variable `TOKEN = value`.
fn with_secret(id: &str, version: Pk, value: &str) -> Resource {
    let mut topology = crate::test_support::deployment_topology(id, version);
    topology.spec.secret_env.insert(
        "TOKEN".into(),
        wire::workload::SecretValue::Plain(value.into()),
    );
    Resource::DeploymentTopology(topology)
}

/// The snapshot holds a Secret's digest only: a full sync after a restart
/// applies nothing for a resource streamed with the same values (and
/// holds them, for drift repair), and applies one whose value changed
/// under the same version.
#[tokio::test]
async fn a_full_sync_compares_secret_values_by_digest_and_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    {
        let state = LocalState::open_in(dir.path()).unwrap();
        state.record_synced(&with_secret("a", 3, "t0k3n")).unwrap();
        state.record_synced(&with_secret("b", 4, "t0k3n")).unwrap();
        state.record_sync_end(4, 0).unwrap();
    }
    let state = LocalState::open_in(dir.path()).unwrap();
    let recorded = |id| state.applied_resource(&topology_key(id)).unwrap().unwrap();
    assert_eq!(
        state.with_secrets(&recorded("a")),
        None,
        "a restart holds none"
    );
    let fake = Fake::default();
    let mut server = WatchServer::new();
    let events = vec![
        server.sync_start(4, 0).unwrap(),
        server.sync_item(with_secret("a", 3, "t0k3n")).unwrap(),
        server.sync_item(with_secret("b", 4, "rotated")).unwrap(),
        server.sync_end().unwrap(),
    ];
    let mut handler = new_handler(&state, &fake, 0);
    feed(&mut handler, events).await;
    assert_eq!(
        fake.take(),
        [apply("b", 4)],
        "a is unchanged, b's value is not"
    );
    assert_eq!(
        state.with_secrets(&recorded("a")),
        Some(with_secret("a", 3, "t0k3n")),
        "streamed equal to the snapshot: its values are held"
    );
    assert_eq!(
        state.with_secrets(&recorded("b")),
        Some(with_secret("b", 4, "rotated"))
    );
    assert!(recorded("b").matches(&with_secret("b", 4, "rotated")));
}

#[tokio::test]
async fn an_older_spec_is_never_applied_after_a_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_synced(&topology("a", 9)).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5);
    // Version 6 carries a spec of version 6, older than the applied 9.
    step(&mut handler, change(&mut server, 6, "a")).await;
    assert!(fake.take().is_empty());
    assert_eq!(state.cursor().unwrap(), 6);
    assert_eq!(applied_ids(&state), [("a".to_string(), 9)]);
}

#[tokio::test]
async fn a_resumed_stream_does_not_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    let fake = Fake::default();
    let mut server = WatchServer::new();
    let mut handler = new_handler(&state, &fake, 0);
    feed(&mut handler, full_sync(&mut server, 3, &[("a", 3)])).await;
    drop(handler);
    drop(state);

    // A restart: reopen, resume from the stored cursor.
    let state = LocalState::open_in(dir.path()).unwrap();
    let cursor = state.cursor().unwrap();
    assert_eq!(cursor, 3);
    let mut server = WatchServer::new();
    server.resume(cursor).unwrap();
    let mut handler = new_handler(&state, &fake, cursor);
    step(&mut handler, change(&mut server, 4, "b")).await;
    assert_eq!(state.full_syncs().unwrap(), 1);
    assert_eq!(state.cursor().unwrap(), 4);
}

#[tokio::test]
async fn a_slow_resource_does_not_stall_the_others_and_holds_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    fake.slow_on(Some("slow"));
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5);
    for (version, id) in [(6, "slow"), (7, "b"), (8, "c")] {
        handler
            .on_event(change(&mut server, version, id))
            .await
            .unwrap();
    }
    // b and c finish while the slow one is still applying (in either
    // order: they run at once).
    handler.next_done().await.unwrap();
    handler.next_done().await.unwrap();
    let mut done = fake.take();
    done.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(done, [apply("b", 7), apply("c", 8)]);
    assert_eq!(
        applied_ids(&state),
        [("b".to_string(), 7), ("c".to_string(), 8)],
        "recorded in the snapshot"
    );
    assert_eq!(state.cursor().unwrap(), 5, "not past the slow one");
    assert_eq!(handler.cursor(), 5);
    // A bookmark past them waits behind it too.
    handler.on_event(server.progress(9).unwrap()).await.unwrap();
    assert_eq!(state.cursor().unwrap(), 5);

    fake.release.notify_one();
    handler.settle().await.unwrap();
    assert_eq!(fake.take(), [apply("slow", 6)]);
    assert_eq!(state.cursor().unwrap(), 9, "the whole prefix is applied");
    assert_eq!(handler.cursor(), 9);
}

#[tokio::test]
async fn one_resource_is_applied_in_pk_order_even_when_slow() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    fake.slow_on(Some("a"));
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5);
    handler.on_event(change(&mut server, 6, "a")).await.unwrap();
    handler.on_event(change(&mut server, 7, "b")).await.unwrap();
    handler.on_event(change(&mut server, 8, "a")).await.unwrap();
    handler.next_done().await.unwrap();
    assert_eq!(fake.take(), [apply("b", 7)], "a@8 waits behind a@6");
    fake.release.notify_one();
    handler.next_done().await.unwrap();
    fake.release.notify_one();
    handler.settle().await.unwrap();
    assert_eq!(fake.take(), [apply("a", 6), apply("a", 8)]);
    assert_eq!(state.cursor().unwrap(), 8);
    assert_eq!(applied_ids(&state)[0], ("a".to_string(), 8));
}

#[tokio::test]
async fn a_stream_repeated_after_a_crash_applies_only_what_was_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    {
        let state = LocalState::open_in(dir.path()).unwrap();
        state.record_progress(5).unwrap();
        fake.slow_on(Some("a"));
        let mut server = WatchServer::new();
        server.resume(5).unwrap();
        let mut handler = new_handler(&state, &fake, 5);
        for (version, id) in [(6, "a"), (7, "b"), (8, "c")] {
            handler
                .on_event(change(&mut server, version, id))
                .await
                .unwrap();
        }
        handler.next_done().await.unwrap();
        handler.next_done().await.unwrap();
        // The crash: a never finished; b and c are in the snapshot.
        assert_eq!(state.cursor().unwrap(), 5);
    }
    fake.slow_on(None);
    // b and c are applied concurrently: either may finish first.
    let mut done = fake.take();
    done.sort_by_key(|call| format!("{call:?}"));
    assert_eq!(done, [apply("b", 7), apply("c", 8)]);
    let state = LocalState::open_in(dir.path()).unwrap();
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5);
    let events = [(6, "a"), (7, "b"), (8, "c")]
        .into_iter()
        .map(|(version, id)| change(&mut server, version, id))
        .collect();
    feed(&mut handler, events).await;
    assert_eq!(
        fake.take(),
        [apply("a", 6)],
        "b and c are not applied twice"
    );
    assert_eq!(state.cursor().unwrap(), 8);
}

#[tokio::test]
async fn a_failing_resource_is_retried_while_the_others_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let state = LocalState::open_in(dir.path()).unwrap();
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    fake.fail_on(Some("bad"));
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5);
    for (version, id) in [(6, "a"), (7, "bad"), (8, "c")] {
        handler
            .on_event(change(&mut server, version, id))
            .await
            .unwrap();
    }
    let error = handler.settle().await;
    assert!(matches!(error, Err(WatchError::K8s(_))), "{error:?}");
    let mut applied = fake.take();
    applied.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(applied, [apply("a", 6), apply("c", 8)]);
    assert_eq!(state.cursor().unwrap(), 6, "not past the failed change");
}

fn reset_by_ctrl(code: u32) -> TransportError {
    let read = quinn::ReadError::Reset(quinn::VarInt::from_u32(code));
    TransportError::Frame(wire::frame::FrameError::Io(std::io::Error::from(read)))
}

#[test]
fn a_slow_consumer_reset_is_told_apart_from_other_failures() {
    let slow = WatchError::from(reset_by_ctrl(wire::agent::SLOW_CONSUMER_RESET_CODE));
    assert!(matches!(slow, WatchError::SlowConsumer), "{slow:?}");
    assert!(slow.to_string().contains("slow consumer"), "{slow}");

    let other = WatchError::from(reset_by_ctrl(7));
    assert!(matches!(other, WatchError::Transport(_)), "{other:?}");
    let closed = WatchError::from(TransportError::NoPeerCertificate);
    assert!(matches!(closed, WatchError::Transport(_)), "{closed:?}");
}

#[tokio::test]
async fn a_rejected_version_is_recorded_reported_and_passed_and_a_newer_one_is_tried() {
    let dir = tempfile::tempdir().unwrap();
    let state = std::sync::Arc::new(LocalState::open_in(dir.path()).unwrap());
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    *fake.store.lock().unwrap() = Some(state.clone());
    fake.reject_on(Some("b"));
    let failures = crate::heartbeat::FailedApplies::default();
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5).recording_failures(&failures);
    for (version, id) in [(6, "a"), (7, "b"), (8, "c")] {
        step(&mut handler, change(&mut server, version, id)).await;
    }
    // The region's later change was applied; the cursor passed the rejection.
    assert_eq!(
        fake.take(),
        [apply("a", 6), Call::Rejected("b".into(), 7), apply("c", 8)]
    );
    assert_eq!(state.cursor().unwrap(), 8);
    assert_eq!(state.rejected_version(&topology_key("b")).unwrap(), Some(7));
    let reported = state.apply_outbox(10).unwrap();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].version, 7);
    assert_eq!(
        reported[0].outcome.rejection().unwrap(),
        "refused by krane: b is invalid"
    );
    assert_eq!(failures.list()[0].key.resource_id, "b");
    assert_eq!(
        applied_ids(&state),
        [("a".to_string(), 6), ("c".to_string(), 8)],
        "the snapshot holds what was applied, never the rejected spec"
    );

    // Streamed again (a full sync), the rejected version is not tried again.
    let mut server = WatchServer::new();
    let mut handler = new_handler(&state, &fake, 0).recording_failures(&failures);
    feed(
        &mut handler,
        full_sync(&mut server, 8, &[("a", 6), ("b", 7), ("c", 8)]),
    )
    .await;
    assert_eq!(fake.take(), [], "nothing new to write");

    // A newer version of it is tried, and applied once valid.
    fake.reject_on(None);
    let mut server = WatchServer::new();
    server.resume(8).unwrap();
    let mut handler = new_handler(&state, &fake, 8).recording_failures(&failures);
    step(&mut handler, change(&mut server, 9, "b")).await;
    assert_eq!(fake.take(), [apply("b", 9)]);
    assert_eq!(state.cursor().unwrap(), 9);
    assert!(failures.list().is_empty(), "applied: no longer failing");
}

#[tokio::test]
async fn a_refused_delete_is_reported_and_holds_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let state = std::sync::Arc::new(LocalState::open_in(dir.path()).unwrap());
    state.record_progress(5).unwrap();
    let fake = Fake::default();
    *fake.store.lock().unwrap() = Some(state.clone());
    let failures = crate::heartbeat::FailedApplies::default();
    let mut server = WatchServer::new();
    server.resume(5).unwrap();
    let mut handler = new_handler(&state, &fake, 5).recording_failures(&failures);
    step(&mut handler, change(&mut server, 6, "b")).await;
    *fake.refusing_delete.lock().unwrap() = Some("b".into());
    step(&mut handler, delete(&mut server, 7, "b")).await;
    step(&mut handler, change(&mut server, 8, "c")).await;
    // The delete was tried once (a permanent refusal is not retried), and
    // the region's later change was applied: the cursor passed it.
    assert_eq!(
        fake.take(),
        [apply("b", 6), Call::Rejected("b".into(), 7), apply("c", 8)]
    );
    assert_eq!(state.cursor().unwrap(), 8);
    let reported = state.apply_outbox(10).unwrap();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].version, 7);
    let why = reported[0].outcome.rejection().unwrap();
    assert!(why.contains("admission webhook"), "{why}");
    let failing = failures.list();
    assert_eq!(failing[0].key.resource_id, "b");
    assert!(
        failing[0].error.contains("admission webhook"),
        "{failing:?}"
    );
    // Forgotten from the snapshot: drift repair does not keep the object.
    assert_eq!(applied_ids(&state), [("c".to_string(), 8)]);
}

/// A ctrl node in the test's runtime: serves the agent protocol on
/// loopback, answers a watch at cursor 0 with a full sync of `a` ending
/// at cursor 5 (epoch 1), holds every stream open, and sends the cursor
/// of each watch request, with when it came, on `requests`.
async fn fake_ctrl(
    dir: &std::path::Path,
) -> (
    config::AgentConfig,
    tokio::sync::mpsc::UnboundedReceiver<(Instant, Pk)>,
) {
    let certs =
        transport::certs::init_dir(dir, &[1], &[crate::test_support::REGION.into()], &[]).unwrap();
    let server_config = transport::tls::server_config(
        &certs.tls_paths(certs.node(1).unwrap()),
        &[wire::agent::ALPN],
    )
    .unwrap();
    let (endpoint, _closed) =
        transport::endpoint::server_endpoint(([127, 0, 0, 1], 0).into(), server_config).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let (requests, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let Ok(connection) = incoming.await else {
                continue;
            };
            let requests = requests.clone();
            tokio::spawn(async move {
                while let Ok((send, recv)) = connection.accept_bi().await {
                    let requests = requests.clone();
                    tokio::spawn(serve_watch(send, recv, requests));
                }
            });
        }
    });
    let region = crate::test_support::REGION;
    let tls = config::TlsFiles::in_dir(dir, &format!("agent-{region}"));
    (
        config::AgentConfig::new(region, vec![addr.into()], tls),
        received,
    )
}

async fn serve_watch(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    requests: tokio::sync::mpsc::UnboundedSender<(Instant, Pk)>,
) {
    let Ok(mut stream) = transport::stream::accept_call(
        send,
        recv,
        wire::hello::Protocol::Agent,
        wire::frame::FRAME_BYTES_MAX,
    )
    .await
    else {
        return;
    };
    let Ok(Some(wire::agent::AgentRequest::Watch(request))) =
        stream.recv::<wire::agent::AgentRequest>().await
    else {
        return;
    };
    let _ = requests.send((Instant::now(), request.cursor));
    if request.cursor == 0 {
        let mut server = WatchServer::new();
        let events = vec![
            server.sync_start(5, 1).unwrap(),
            server.sync_item(topology("a", 5)).unwrap(),
            server.sync_end().unwrap(),
        ];
        for event in events {
            if stream.send(&event).await.is_err() {
                return;
            }
        }
    }
    // Open until the agent goes: nothing more to send.
    let _ = stream.recv::<wire::agent::AgentRequest>().await;
}

/// The periodic full sync: once synced, the loop keeps its stream for
/// `full_resync_interval` and then watches from cursor 0 again (not
/// before; the paused clock moves only when everything waits).
#[tokio::test(start_paused = true)]
async fn the_loop_asks_for_a_full_sync_again_after_the_resync_interval() {
    const INTERVAL: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let (config, mut requests) = fake_ctrl(dir.path()).await;
    let data = tempfile::tempdir().unwrap();
    let state = Arc::new(LocalState::open_in(data.path()).unwrap());
    let (status, _) = watch::channel(WatchStatus::default());
    let watch_loop = WatchLoop::new(
        Arc::new(CtrlClient::new(&config).unwrap()),
        state.clone(),
        Arc::new(Fake::default()),
        Arc::new(KeyLocks::default()),
        8,
        Backoff::new(10, 100),
        rand::SeedableRng::seed_from_u64(1),
        INTERVAL,
        status,
    );
    let task = tokio::spawn(watch_loop.run());

    let (first_at, first) = requests.recv().await.unwrap();
    assert_eq!(first, 0, "a fresh state starts with a full sync");
    // Not before the interval: the stream of the first sync is kept.
    let early = tokio::time::timeout(INTERVAL - Duration::from_millis(100), requests.recv()).await;
    assert!(early.is_err(), "asked again before the interval: {early:?}");
    assert_eq!(state.cursor().unwrap(), 5, "the first sync is stored");
    // After it: a full sync again, while the stored cursor stays.
    let (again_at, again) = tokio::time::timeout(INTERVAL, requests.recv())
        .await
        .expect("no full sync after the interval")
        .unwrap();
    assert_eq!(again, 0, "the periodic sync watches from cursor 0");
    let waited = again_at - first_at;
    assert!(waited >= INTERVAL, "asked again after {waited:?}");
    assert_eq!(state.cursor().unwrap(), 5);
    task.abort();
}

/// A full sync asked for (the drift repairer's, for secret values it does
/// not hold) runs long before the periodic one, but not sooner than
/// [`REQUESTED_SYNC_INTERVAL_MIN_MS`] after the last full sync began;
/// requests made meanwhile make one sync.
#[tokio::test(start_paused = true)]
async fn a_requested_full_sync_runs_once_and_not_too_often() {
    const PERIODIC: Duration = Duration::from_secs(3_600);
    let min = Duration::from_millis(REQUESTED_SYNC_INTERVAL_MIN_MS);
    let dir = tempfile::tempdir().unwrap();
    let (config, mut requests) = fake_ctrl(dir.path()).await;
    let data = tempfile::tempdir().unwrap();
    let state = Arc::new(LocalState::open_in(data.path()).unwrap());
    let (status, _) = watch::channel(WatchStatus::default());
    let sync_requests = SyncRequests::default();
    let watch_loop = WatchLoop::new(
        Arc::new(CtrlClient::new(&config).unwrap()),
        state.clone(),
        Arc::new(Fake::default()),
        Arc::new(KeyLocks::default()),
        8,
        Backoff::new(10, 100),
        rand::SeedableRng::seed_from_u64(1),
        PERIODIC,
        status,
    )
    .with_sync_requests(sync_requests.clone());
    let task = tokio::spawn(watch_loop.run());

    let (first_at, first) = requests.recv().await.unwrap();
    assert_eq!(first, 0);
    // Synced (the fake's sync ends at 5); then asked three times.
    while state.cursor().unwrap() != 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..3 {
        sync_requests.request();
    }
    let (asked_at, asked) = tokio::time::timeout(2 * min, requests.recv())
        .await
        .expect("the requested full sync")
        .unwrap();
    assert_eq!(asked, 0, "a full sync");
    let waited = asked_at - first_at;
    assert!(
        waited >= min && waited < PERIODIC,
        "asked after {waited:?} from the first sync"
    );
    // Served: no further sync until asked again.
    let again = tokio::time::timeout(3 * min, requests.recv()).await;
    assert!(again.is_err(), "three requests made one sync: {again:?}");
    sync_requests.request();
    let (_, asked) = tokio::time::timeout(2 * min, requests.recv())
        .await
        .expect("asked again")
        .unwrap();
    assert_eq!(asked, 0);
    assert_eq!(state.cursor().unwrap(), 5, "the cursor stays while syncing");
    task.abort();
}
