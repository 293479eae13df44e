//! Sentinels: one per environment and region. An apply finds the
//! environment's sentinel among the region's (on this node's applied
//! state) and merges the request over it (every option left out keeps its
//! value, the image included), or creates one over the defaults with the
//! id derived from environment and region. The merged sentinel is proposed
//! as a deploy (`Mutation::DeploySentinel`): apply writes nothing when the
//! spec is unchanged and krane reports it converged (answered `ready`),
//! else writes it `progressing` with an absolute deadline; the leader's
//! sentinel workflow and the apply of krane's reports take it to `ready`
//! or `failed`.

use storage::{Mutation, mutations};
use wire::model::{DesiredState, Sentinel};
use wire::operator::{ApplySentinel, LIST_PAGE_MAX, SENTINEL_DEADLINE_MS_DEFAULT, SentinelView};
use wire::rules::deploy::sentinel_id;
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, not_found, propose, recorded};

/// Size of a new sentinel when the request leaves it open.
pub const SENTINEL_REPLICAS_DEFAULT: u32 = 2;
/// CPU per replica of a new sentinel when the request leaves it open, in millicores.
pub const SENTINEL_CPU_MILLICORES_DEFAULT: u32 = 500;
/// Memory per replica of a new sentinel when the request leaves it open, in MiB.
pub const SENTINEL_MEMORY_MIB_DEFAULT: u32 = 512;
/// Most policies of one region read to find the one an apply updates
/// (a sentinel is looked up by its likely id first, see
/// `storage::ReadView::environment_sentinel`).
pub const REGION_SCAN_MAX: usize = 100_000;

/// What a sentinel apply answers: the id, the version, where its deploy
/// is (`ready` at once when nothing changed and it had converged).
pub type Deployed = mutations::SentinelDeployed;

/// Creates the sentinel of (environment, region) or deploys a change of
/// the one it has. The lookup reads this node's applied state.
pub async fn apply<S: Propose + ReadState>(
    state: &S,
    apply: ApplySentinel,
) -> Result<Deployed, WireError> {
    apply.validate()?;
    let existing = {
        let view = state.read().map_err(internal)?;
        let likely_id = sentinel_id(&apply.environment_id, &apply.region);
        view.environment_sentinel(&apply.environment_id, &apply.region, &likely_id)
            .map_err(internal)?
    };
    if existing.is_none() && apply.image.is_none() {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            "a new sentinel needs an image",
        ));
    }
    let deadline_ms = apply.deadline_ms.unwrap_or(SENTINEL_DEADLINE_MS_DEFAULT);
    let sentinel = merge(existing, apply);
    let mutation = mutations::DeploySentinel {
        sentinel,
        deadline_ms,
    };
    propose(state, mutation).await
}

/// The sentinel an apply asks for: the request's fields over `existing`
/// (or over the defaults, with a fresh id), running. Version and
/// timestamps are left to apply.
pub fn merge(existing: Option<Sentinel>, apply: ApplySentinel) -> Sentinel {
    let base = existing.unwrap_or_else(|| {
        // The id a deploy gives the environment's sentinel too: an apply
        // and a deploy's start racing for a new environment write one
        // sentinel, not two.
        let id = sentinel_id(&apply.environment_id, &apply.region);
        Sentinel {
            k8s_name: wire::k8s_name::sentinel(&id),
            k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.to_string(),
            id,
            workspace_id: String::new(),
            project_id: String::new(),
            app_id: String::new(),
            environment_id: String::new(),
            region: String::new(),
            image: String::new(),
            cpu_millicores: SENTINEL_CPU_MILLICORES_DEFAULT,
            memory_mib: SENTINEL_MEMORY_MIB_DEFAULT,
            replicas: SENTINEL_REPLICAS_DEFAULT,
            desired_state: DesiredState::Running,
            version: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            deploy: wire::model::SentinelDeploy::default(),
        }
    });
    Sentinel {
        workspace_id: apply.workspace_id,
        project_id: apply.project_id,
        app_id: apply.app_id,
        environment_id: apply.environment_id,
        region: apply.region,
        image: apply.image.unwrap_or(base.image.clone()),
        replicas: apply.replicas.unwrap_or(base.replicas),
        cpu_millicores: apply.cpu_millicores.unwrap_or(base.cpu_millicores),
        memory_mib: apply.memory_mib.unwrap_or(base.memory_mib),
        desired_state: DesiredState::Running,
        ..base
    }
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

    #[test]
    fn a_new_sentinel_gets_an_id_a_name_and_defaults() {
        let s = merge(None, request("env_1", "us-east", None));
        // The id a deploy would give it: one per environment and region.
        let id = sentinel_id("env_1", "us-east");
        assert_eq!(s.id, id);
        assert_eq!(s.k8s_name, id.replacen('_', "-", 1));
        assert_eq!(s.k8s_name.len(), "snt-".len() + 26);
        assert_eq!(s.k8s_namespace, "sentinel");
        assert_eq!(s.workspace_id, "ws_1");
        assert_eq!(s.project_id, "proj_1");
        assert_eq!(s.app_id, "app_1");
        assert_eq!(s.environment_id, "env_1");
        assert_eq!(s.region, "us-east");
        assert_eq!(s.image, "sentinel:2");
        assert_eq!(s.replicas, SENTINEL_REPLICAS_DEFAULT);
        assert_eq!(s.cpu_millicores, SENTINEL_CPU_MILLICORES_DEFAULT);
        assert_eq!(s.memory_mib, 1024);
        assert_eq!(s.desired_state, DesiredState::Running);
    }

    #[test]
    fn an_apply_keeps_the_id_and_the_fields_it_leaves_open() {
        let mut existing = merge(None, request("env_1", "us-east", Some(3)));
        existing.id = "snt_old".into();
        existing.k8s_name = "snt-old".into();
        existing.cpu_millicores = 300;
        existing.desired_state = DesiredState::Stopped;
        existing.version = 9;
        existing.created_at_ms = 5;
        let s = merge(Some(existing), request("env_1", "us-east", None));
        assert_eq!(s.id, "snt_old");
        assert_eq!(s.k8s_name, "snt-old");
        assert_eq!(s.replicas, 3);
        assert_eq!(s.cpu_millicores, 300);
        assert_eq!(s.memory_mib, 1024);
        assert_eq!(s.desired_state, DesiredState::Running, "apply restarts");
        assert_eq!((s.version, s.created_at_ms), (9, 5));
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
}
