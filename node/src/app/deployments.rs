//! Deployments: create one (the request over the defaults, an id minted
//! from the clock), read its view (the deployment and its reported
//! instances), list them in pages, stop or start one, and wait for its
//! view to change (`WaitDeployment`, a long poll woken by applies).

use config::DeploySettings;

use storage::mutations;
use wire::model::{Deployment, DeploymentStatus, DesiredState, Environment, JournalEntry};
use wire::operator::{
    CreateDeployment, DeploymentUpdate, DeploymentView, LIST_PAGE_MAX, SCHEDULE_AFTER_MS_MAX,
};
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, long_poll, propose};
use crate::clock::{Clock, deployment_id};

/// Creates a deployment, running and deploying, stamped with the clock's
/// time; returns its id. A region that is unknown or cordoned on this
/// node's applied state is refused before proposing (apply checks again:
/// it decides).
pub async fn create<S: Propose + ReadState>(
    state: &S,
    clock: &dyn Clock,
    settings: &DeploySettings,
    create: CreateDeployment,
) -> Result<String, WireError> {
    create.validate()?;
    {
        let view = state.read().map_err(internal)?;
        super::regions::check_schedulable(&view, &create.regions)?;
    }
    let now_ms = clock.now_ms();
    let regions = u32::try_from(create.regions.len()).unwrap_or(u32::MAX);
    let workflow = wire::rules::deploy::new_workflow(
        create
            .progress_deadline_ms
            .unwrap_or(settings.progress_deadline_ms),
        settings.fail_fast_ms,
        create.min_ready_regions.unwrap_or(regions),
        true,
    );
    let id = deployment_id(clock);
    let mut spec = create.spec;
    super::secrets::seal(state.keyring(), &id, &mut spec)?;
    let deployment = Deployment {
        id,
        workspace_id: create.workspace_id,
        project_id: create.project_id,
        environment_id: create.environment_id,
        image: create.image,
        cpu_millicores: create.cpu_millicores,
        memory_mib: create.memory_mib,
        replicas: create.replicas,
        regions: create.regions,
        env_vars: create.env_vars,
        desired_state: DesiredState::Running,
        status: DeploymentStatus::Pending,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        workflow,
        spec,
    };
    propose(state, mutations::CreateDeployment { deployment }).await
}

/// The deployment and its reported instances, from one read; its
/// secrets by name only (no ciphertext leaves the node for an operator).
pub fn view(state: &impl ReadState, id: &str) -> Result<DeploymentView, WireError> {
    let view = state.read().map_err(internal)?;
    let mut deployment = view
        .deployment(id)
        .map_err(internal)?
        .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no deployment {id:?}")))?;
    super::secrets::names_only(&mut deployment.spec);
    let instances = view.instances(id).map_err(internal)?;
    let mut rejected = Vec::new();
    for region in &deployment.regions {
        let Some(topology) = view.topology(id, region).map_err(internal)? else {
            continue;
        };
        let key = wire::model::ResourceKey {
            resource_type: wire::model::ResourceType::DeploymentTopology,
            resource_id: id.to_string(),
            region: region.clone(),
        };
        // A deploy that failed stopped its topologies: the refusal of the
        // version it ran with is why, and stays shown.
        let refusal = if deployment.status == DeploymentStatus::Failed {
            view.apply_report(&key)
                .map_err(internal)?
                .filter(|r| !r.outcome.is_applied())
        } else {
            view.rejected(&key, topology.version).map_err(internal)?
        };
        rejected.extend(refusal);
    }
    Ok(DeploymentView {
        deployment,
        instances,
        rejected,
    })
}

/// Answers the deployment's view once its digest differs from `seen`, or
/// when `wait_ms` has passed. Woken by applies, never by a timer; each
/// apply costs one read of the deployment.
pub async fn wait(
    state: &impl ReadState,
    id: &str,
    seen: u64,
    wait_ms: u64,
) -> Result<DeploymentView, WireError> {
    long_poll(
        state,
        &storage::command::Touched::Deployment(id.to_string()),
        seen,
        wait_ms,
        || view(state, id),
        DeploymentView::digest,
    )
    .await
}

/// One page of deployments in id order, after `after`, and where the next
/// page starts (`None` after a short page).
pub fn list(
    state: &impl ReadState,
    after: Option<&str>,
    limit: u32,
) -> Result<(Vec<Deployment>, Option<String>), WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.read().map_err(internal)?;
    let mut items = view
        .list_deployments(after, limit as usize)
        .map_err(internal)?;
    for item in &mut items {
        super::secrets::names_only(&mut item.spec);
    }
    let next_after = if items.len() == limit as usize {
        items.last().map(|d| d.id.clone())
    } else {
        None
    };
    Ok((items, next_after))
}

/// Sets a deployment's desired state, now or `after_ms` from now; returns
/// it as it now is.
pub async fn set_desired_state(
    state: &impl Propose,
    clock: &dyn Clock,
    deployment_id: String,
    desired_state: DesiredState,
    after_ms: Option<u64>,
    force: bool,
) -> Result<Deployment, WireError> {
    if let Some(after_ms) = after_ms
        && after_ms > SCHEDULE_AFTER_MS_MAX
    {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("a change may be scheduled at most {SCHEDULE_AFTER_MS_MAX} ms ahead"),
        ));
    }
    let mutation = mutations::SetDesiredState {
        deployment_id,
        desired_state,
        at_ms: after_ms.map(|ms| clock.now_ms().saturating_add(ms)),
        force,
    };
    propose(state, mutation).await
}

/// Changes the replicas, size or health check of a deployment; returns
/// it as it now is. Bounds are checked before proposing; apply checks the
/// health check against the deployment's spec.
pub async fn update(
    state: &impl Propose,
    deployment_id: String,
    update: DeploymentUpdate,
) -> Result<Deployment, WireError> {
    update.validate()?;
    let mutation = mutations::UpdateDeployment {
        deployment_id,
        update,
    };
    propose(state, mutation).await
}

/// Cancels a deploy in flight; returns the deployment as it now is.
pub async fn cancel(state: &impl Propose, deployment_id: String) -> Result<Deployment, WireError> {
    propose(state, mutations::CancelDeployment { deployment_id }).await
}

/// Rolls an environment back to `to` (or its previous live deployment);
/// returns the deployment rolled back to.
pub async fn rollback(
    state: &impl Propose,
    environment_id: String,
    to: Option<String>,
) -> Result<Deployment, WireError> {
    propose(state, mutations::Rollback { environment_id, to }).await
}

/// An environment, by id.
pub fn environment(state: &impl ReadState, id: &str) -> Result<Environment, WireError> {
    state
        .read()
        .map_err(internal)?
        .environment(id)
        .map_err(internal)?
        .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no environment {id:?}")))
}

/// Most journal entries one history read scans.
pub const HISTORY_SCAN_MAX: usize = 100_000;

/// A page of the journal after `after`, of one environment or deployment
/// if named, and where the next page starts.
pub fn history(
    state: &impl ReadState,
    environment_id: Option<&str>,
    deployment_id: Option<&str>,
    after: u64,
    limit: u32,
) -> Result<(Vec<JournalEntry>, Option<u64>), WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.read().map_err(internal)?;
    let entries = view
        .journal(after, limit as usize, HISTORY_SCAN_MAX, |entry| {
            environment_id.is_none_or(|e| e == entry.environment_id)
                && deployment_id.is_none_or(|d| d == entry.deployment_id)
        })
        .map_err(internal)?;
    let next_after = if entries.len() == limit as usize {
        entries.last().map(|e| e.seq)
    } else {
        None
    };
    Ok((entries, next_after))
}

/// Test support of the layers above: a deployment created and started
/// (without the workflow), or failed, on a [`MemoryNode`].
#[cfg(test)]
pub(crate) mod testing {
    use storage::command::{DeployAction, DeployTransition};
    use storage::{Mutation, Outcome};
    use wire::model::Deployment;
    use wire::rules::deploy::{DEPLOYMENT_NAMESPACE, deploy_guard, new_sentinel, policies};

    use crate::app::testing::{MemoryNode, create_request};
    use crate::app::{Propose, ReadState};

    /// Creates a deployment of [`create_request`] and starts it as the deploy
    /// workflow's first step does (the records of [`wire::rules::deploy`]:
    /// its topologies, the environment's sentinel and the deployment's two
    /// policies in every region are written); its id. It proposes the start
    /// itself rather than run the workflow, so the application layer's tests
    /// need nothing above it (an older deploy to the environment is not
    /// superseded here, as the workflow would).
    pub(crate) async fn deployed(node: &MemoryNode, regions: &[&str]) -> String {
        let settings = config::DeploySettings::default();
        let id = super::create(node, node.clock(), &settings, create_request(regions))
            .await
            .expect("create");
        let deployment = stored(node, &id);
        let start = DeployAction::Start {
            k8s_namespace: DEPLOYMENT_NAMESPACE.to_string(),
            sentinels: deployment
                .regions
                .iter()
                .map(|region| new_sentinel(&deployment, region, &settings.sentinel_image))
                .collect(),
            policies: deployment
                .regions
                .iter()
                .flat_map(|region| policies(&deployment, region))
                .collect(),
        };
        transition(node, &deployment, start).await;
        id
    }

    /// Deploys one deployment and fails it (an event for every webhook
    /// endpoint); its id.
    pub(crate) async fn failed_deploy(node: &MemoryNode) -> String {
        let id = deployed(node, &["eu-west"]).await;
        let deployment = stored(node, &id);
        let fail = DeployAction::Fail {
            reason: "deadline".into(),
        };
        transition(node, &deployment, fail).await;
        id
    }

    /// The stored deployment `id`.
    fn stored(node: &MemoryNode, id: &str) -> Deployment {
        node.read()
            .expect("read")
            .deployment(id)
            .expect("read")
            .expect("the deployment")
    }

    /// Proposes `action` on `deployment`, guarded as the workflow guards it;
    /// it must be recorded.
    async fn transition(node: &MemoryNode, deployment: &Deployment, action: DeployAction) {
        let out = node
            .propose(vec![Mutation::Deploy(DeployTransition {
                deployment_id: deployment.id.clone(),
                expected: deploy_guard(deployment),
                action,
            })])
            .await
            .expect("proposed");
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
    }
}

#[cfg(test)]
mod tests;
