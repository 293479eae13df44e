//! Sentinels: one per environment and region. An apply proposes the
//! request's options as a patch (`Mutation::PatchSentinel`), and the state
//! machine merges it, at apply, over the environment's sentinel in the
//! region as it stands then (every option left out keeps its value, the
//! image included), or over the defaults with the id derived from
//! environment and region ([`wire::rules::sentinel::merge`]). Nothing is
//! merged over this node's own view, which may be behind: concurrent
//! applies keep each other's fields, and the answer (id, version) is what
//! apply made, recorded under the request id. Apply writes nothing when
//! the spec is unchanged and krane reports it converged (answered
//! `ready`), else writes it `progressing` with an absolute deadline; the
//! leader's sentinel workflow and the apply of krane's reports take it to
//! `ready` or `failed`.

use storage::{Mutation, mutations};
use wire::model::{DesiredState, Sentinel};
use wire::operator::{ApplySentinel, LIST_PAGE_MAX, SENTINEL_DEADLINE_MS_DEFAULT, SentinelView};
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, not_found, propose, recorded};

/// Most policies of one region read to find the one an apply updates
/// (a sentinel is looked up by its likely id first, see
/// `storage::ReadView::environment_sentinel`).
pub const REGION_SCAN_MAX: usize = 100_000;

/// What a sentinel apply answers: the id, the version, where its deploy
/// is (`ready` at once when nothing changed and it had converged).
pub type Deployed = mutations::SentinelDeployed;

/// Creates the sentinel of (environment, region) or deploys a change of
/// the one it has: the request checked, then proposed as a patch merged
/// at apply (a new sentinel without an image is refused there).
pub async fn apply<S: Propose>(state: &S, apply: ApplySentinel) -> Result<Deployed, WireError> {
    apply.validate()?;
    let deadline_ms = apply.deadline_ms.unwrap_or(SENTINEL_DEADLINE_MS_DEFAULT);
    let mutation = mutations::PatchSentinel {
        patch: apply.into(),
        deadline_ms,
    };
    propose(state, mutation).await
}

/// Stops the sentinel `id` (its objects are deleted); stopping a stopped
/// one proposes nothing.
pub async fn stop<S: Propose + ReadState>(state: &S, id: &str) -> Result<(), WireError> {
    let mut sentinel = find(state, id)?;
    if sentinel.desired_state != DesiredState::Stopped {
        sentinel.desired_state = DesiredState::Stopped;
        recorded(state, Mutation::UpsertSentinel(sentinel)).await?;
    }
    Ok(())
}

/// The sentinel `id` and its last reported status, from one read.
pub fn get(state: &impl ReadState, id: &str) -> Result<SentinelView, WireError> {
    let view = state.read().map_err(internal)?;
    let sentinel = view
        .find_sentinel(id)
        .map_err(internal)?
        .ok_or_else(|| not_found("sentinel", id))?;
    let status = view
        .sentinel_status(id, &sentinel.region)
        .map_err(internal)?;
    let rejected = rejection(&view, &sentinel)?;
    Ok(SentinelView {
        sentinel,
        status,
        rejected,
    })
}

/// The sentinel `id` of `region` as [`get`] answers it, read by key.
pub fn get_in(state: &impl ReadState, id: &str, region: &str) -> Result<SentinelView, WireError> {
    let view = state.read().map_err(internal)?;
    let sentinel = view
        .sentinel(id, region)
        .map_err(internal)?
        .ok_or_else(|| not_found("sentinel", id))?;
    let status = view.sentinel_status(id, region).map_err(internal)?;
    let rejected = rejection(&view, &sentinel)?;
    Ok(SentinelView {
        sentinel,
        status,
        rejected,
    })
}

/// The long poll of `WaitSentinel`: the sentinel `id` of `region` once
/// its view's digest differs from `seen`, or after `wait_ms`.
pub async fn wait(
    state: &impl ReadState,
    id: &str,
    region: &str,
    seen: u64,
    wait_ms: u64,
) -> Result<SentinelView, WireError> {
    super::long_poll(
        state,
        &storage::command::Touched::Sentinel {
            region: region.to_string(),
            id: id.to_string(),
        },
        seen,
        wait_ms,
        || get_in(state, id, region),
        SentinelView::digest,
    )
    .await
}

/// Kubernetes' rejection of `sentinel`'s current version, if krane
/// reported one.
fn rejection(
    view: &storage::ReadView,
    sentinel: &Sentinel,
) -> Result<Option<wire::model::ApplyReport>, WireError> {
    view.rejected(
        &wire::model::ResourceKey {
            resource_type: wire::model::ResourceType::Sentinel,
            resource_id: sentinel.id.clone(),
            region: sentinel.region.clone(),
        },
        sentinel.version,
    )
    .map_err(internal)
}

/// A page of sentinels with their status, and the `after` of the next.
pub type SentinelPage = (Vec<SentinelView>, Option<(String, String)>);

/// A page of sentinels with their status, in (region, id) order after
/// `after`; the next page's `after`, if there may be more.
pub fn list(
    state: &impl ReadState,
    after: Option<(String, String)>,
    limit: u32,
) -> Result<SentinelPage, WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.read().map_err(internal)?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let after_key = after.as_ref().map(|(r, i)| (r.as_str(), i.as_str()));
    let sentinels = view.sentinels(after_key, limit).map_err(internal)?;
    let next_after = (sentinels.len() == limit)
        .then(|| sentinels.last().map(|s| (s.region.clone(), s.id.clone())))
        .flatten();
    let mut items = Vec::with_capacity(sentinels.len());
    for sentinel in sentinels {
        let status = view
            .sentinel_status(&sentinel.id, &sentinel.region)
            .map_err(internal)?;
        let rejected = rejection(&view, &sentinel)?;
        items.push(SentinelView {
            sentinel,
            status,
            rejected,
        });
    }
    Ok((items, next_after))
}

fn find(state: &impl ReadState, id: &str) -> Result<Sentinel, WireError> {
    let view = state.read().map_err(internal)?;
    view.find_sentinel(id)
        .map_err(internal)?
        .ok_or_else(|| not_found("sentinel", id))
}

#[cfg(test)]
mod tests {
    use wire::ErrorCode;
    use wire::model::{Health, SentinelStatus};
    use wire::rules::deploy::sentinel_id;

    use super::*;
    use crate::app::testing::MemoryNode;

    fn request(environment_id: &str, region: &str, replicas: Option<u32>) -> ApplySentinel {
        ApplySentinel {
            workspace_id: "ws_1".into(),
            project_id: "proj_1".into(),
            app_id: "app_1".into(),
            environment_id: environment_id.into(),
            region: region.into(),
            image: Some("sentinel:2".into()),
            replicas,
            cpu_millicores: None,
            memory_mib: Some(1024),
            deadline_ms: None,
        }
    }

    async fn applied(node: &MemoryNode, request: ApplySentinel) -> Result<String, WireError> {
        apply(node, request).await.map(|d| d.sentinel_id)
    }

    fn sentinel(node: &MemoryNode, id: &str) -> Sentinel {
        get(node, id).unwrap().sentinel
    }

    /// A node behind the leader: its next read returns a view taken
    /// before another node's apply (a view is read once per apply).
    struct Behind<'a> {
        node: &'a MemoryNode,
        stale: std::sync::Mutex<Option<storage::ReadView>>,
    }

    impl Propose for Behind<'_> {
        async fn propose(
            &self,
            mutations: Vec<storage::Mutation>,
        ) -> Result<Vec<storage::MutationResult>, WireError> {
            self.node.propose(mutations).await
        }
    }

    impl ReadState for Behind<'_> {
        fn read(&self) -> Result<storage::ReadView, storage::StorageError> {
            let stale = self.stale.lock().expect("not poisoned").take();
            stale.map_or_else(|| self.node.read(), Ok)
        }

        fn applied_mark(&self) -> Option<u64> {
            self.node.applied_mark()
        }

        async fn applied_past(&self, mark: Option<u64>, wait: std::time::Duration) -> bool {
            self.node.applied_past(mark, wait).await
        }
    }

    /// The pinned regression (issue 32, item 4): an apply received by a
    /// node that is behind keeps what another apply changed in between.
    #[tokio::test]
    async fn an_apply_on_a_node_behind_keeps_the_others_change() {
        let node = MemoryNode::new();
        let id = applied(&node, request("env_1", "us-east", Some(2)))
            .await
            .unwrap();
        let behind = Behind {
            node: &node,
            stale: std::sync::Mutex::new(Some(node.read().unwrap())),
        };
        // Another node's apply changes the image...
        let mut image = request("env_1", "us-east", None);
        image.image = Some("sentinel:3".into());
        applied(&node, image).await.unwrap();
        // ...and this one, received by the node behind, the replicas only.
        let mut replicas = request("env_1", "us-east", Some(5));
        replicas.image = None;
        let answer = apply(&behind, replicas).await.unwrap();
        let stored = sentinel(&node, &id);
        assert_eq!(
            (stored.image.as_str(), stored.replicas),
            ("sentinel:3", 5),
            "both changes kept"
        );
        // The answer is what apply wrote.
        assert_eq!((answer.sentinel_id, answer.version), (id, stored.version));
    }

    #[tokio::test]
    async fn a_new_sentinel_without_an_image_is_refused_and_writes_nothing() {
        let node = MemoryNode::new();
        let before = node.read().unwrap().state_hash().unwrap();
        let mut no_image = request("env_1", "us-east", Some(2));
        no_image.image = None;
        let e = apply(&node, no_image).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
        assert_eq!(node.read().unwrap().state_hash().unwrap(), before);
        let id = sentinel_id("env_1", "us-east");
        assert_eq!(get(&node, &id).unwrap_err().code, ErrorCode::NotFound);
    }

    #[tokio::test]
    async fn the_first_apply_creates_and_the_next_finds_and_updates() {
        let node = MemoryNode::new();
        let id = applied(&node, request("env_1", "us-east", Some(3)))
            .await
            .unwrap();
        let first = sentinel(&node, &id);
        assert_eq!(first.replicas, 3);
        assert_eq!(first.created_at_ms, node.now_ms());

        let mut again = request("env_1", "us-east", None);
        again.image = Some("sentinel:3".into());
        let same = applied(&node, again).await.unwrap();
        assert_eq!(same, id, "found, not created");
        let updated = sentinel(&node, &id);
        assert_eq!(updated.image, "sentinel:3");
        assert_eq!(updated.replicas, 3, "kept what the request left open");
        assert!(updated.version > first.version);
        let region = node
            .read()
            .unwrap()
            .region_sentinels("us-east", 10)
            .unwrap();
        assert_eq!(region.len(), 1);
    }

    #[tokio::test]
    async fn another_environment_or_region_gets_a_sentinel_of_its_own() {
        let node = MemoryNode::new();
        let a = applied(&node, request("env_1", "us-east", None))
            .await
            .unwrap();
        let b = applied(&node, request("env_2", "us-east", None))
            .await
            .unwrap();
        let c = applied(&node, request("env_1", "eu-west", None))
            .await
            .unwrap();
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
        assert_eq!(sentinel(&node, &c).region, "eu-west");
        // The environment's sentinel in each region is found again.
        let again = applied(&node, request("env_1", "eu-west", None))
            .await
            .unwrap();
        assert_eq!(again, c);
    }

    #[tokio::test]
    async fn a_stop_is_recorded_once_and_an_apply_restarts() {
        let node = MemoryNode::new();
        let id = applied(&node, request("env_1", "us-east", None))
            .await
            .unwrap();
        stop(&node, &id).await.unwrap();
        assert_eq!(sentinel(&node, &id).desired_state, DesiredState::Stopped);
        let proposals = node.proposals();
        stop(&node, &id).await.unwrap();
        assert_eq!(
            node.proposals(),
            proposals,
            "already stopped: nothing proposed"
        );
        applied(&node, request("env_1", "us-east", None))
            .await
            .unwrap();
        assert_eq!(sentinel(&node, &id).desired_state, DesiredState::Running);
    }

    #[tokio::test]
    async fn get_shows_the_reported_status_and_unknown_ids_are_not_found() {
        let node = MemoryNode::new();
        let id = applied(&node, request("env_1", "us-east", None))
            .await
            .unwrap();
        assert_eq!(get(&node, &id).unwrap().status, None);
        let status = SentinelStatus {
            sentinel_id: id.clone(),
            region: "us-east".into(),
            available_replicas: 2,
            updated_replicas: 2,
            ready_replicas: 2,
            observed_generation: 1,
            running_image: "sentinel:2".into(),
            health: Health::Healthy,
            updated_at_ms: 9,
            applied_version: 0,
        };
        node.propose(vec![Mutation::ReportSentinelStatus(status.clone())])
            .await
            .unwrap();
        assert_eq!(get(&node, &id).unwrap().status, Some(status));
        assert_eq!(get(&node, "snt_x").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(
            stop(&node, "snt_x").await.unwrap_err().code,
            ErrorCode::NotFound
        );
    }

    /// Polls `waiting` once more: whether it is still pending.
    async fn still_waiting<F: std::future::Future + Unpin>(waiting: &mut F) -> bool {
        tokio::time::timeout(std::time::Duration::ZERO, waiting)
            .await
            .is_err()
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_answers_at_the_sentinels_change_or_at_its_end() {
        let node = MemoryNode::new();
        let id = applied(&node, request("env_1", "us-east", None))
            .await
            .unwrap();
        let other = applied(&node, request("env_2", "us-east", None))
            .await
            .unwrap();
        let seen = get(&node, &id).unwrap().digest();
        let start = tokio::time::Instant::now();
        // Out of date: at once.
        let answer = wait(&node, &id, "us-east", seen ^ 1, 10_000).await.unwrap();
        assert_eq!(answer.digest(), seen);
        let mut waiting = Box::pin(wait(&node, &id, "us-east", seen, 10_000));
        assert!(still_waiting(&mut waiting).await, "nothing changed yet");
        // Another sentinel's report wakes it, and it waits on.
        let report = |sentinel_id: &str| SentinelStatus {
            sentinel_id: sentinel_id.into(),
            region: "us-east".into(),
            available_replicas: 1,
            updated_replicas: 1,
            ready_replicas: 1,
            observed_generation: 1,
            running_image: "sentinel:2".into(),
            health: Health::Healthy,
            updated_at_ms: 9,
            applied_version: 0,
        };
        node.propose(vec![Mutation::ReportSentinelStatus(report(&other))])
            .await
            .unwrap();
        assert!(
            still_waiting(&mut waiting).await,
            "another sentinel changed"
        );
        node.propose(vec![Mutation::ReportSentinelStatus(report(&id))])
            .await
            .unwrap();
        let answer = waiting.await.unwrap();
        assert_eq!(answer.status, Some(report(&id)));
        assert_eq!(tokio::time::Instant::now(), start, "answered at the change");
        // Nothing changes: answered as it is at the end.
        let seen = answer.digest();
        let answer = wait(&node, &id, "us-east", seen, 1_500).await.unwrap();
        assert_eq!(answer.digest(), seen);
        assert_eq!(
            tokio::time::Instant::now() - start,
            std::time::Duration::from_millis(1_500)
        );
        // A sentinel not in that region is not found; a bad wait refused.
        let e = wait(&node, &id, "eu-west", 0, 10).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        let e = wait(&node, &id, "us-east", 0, 0).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
    }
}
