//! The deploy workflow's decisions: for one deployment, from one view of
//! the state at one time, the guarded transition to propose next and when
//! to look again. Pure: no I/O, no clock; the driver passes the time in,
//! and the record's guard goes into every transition.
//!
//! The steps (`storage::apply::workflow` makes them):
//!
//! - `pending`: superseded if its environment's latest attempt is another
//!   deployment; else start (topologies, the environment's sentinel per
//!   region, the deployment's policies).
//! - `deploying`: ready rule — at least `min_ready_regions` regions run
//!   every replica — then `network`.
//! - `network`: the environment's sentinel healthy in every target region,
//!   then `finalizing`.
//! - `finalizing`: becomes live (the replaced deployment goes to standby
//!   after the live grace), then `ready`.
//! - In flight, always: more instances running is progress (the deadline
//!   moves); a region whose every instance failed for `fail_fast_ms` fails
//!   the deploy; the deadline passing fails it. Neither fires before
//!   `leader_grace_ms` after this leader took over.
//! - Out of flight: a scheduled desired-state change when it is due; a
//!   deployment that should not run and has no instance left is `stopped`.

use std::collections::BTreeMap;

use config::DeploySettings;
use storage::apply::workflow::deploy_guard;
use storage::command::{DeployAction, DeployTransition};
use storage::{Mutation, ReadView, StorageError};
use wire::model::{
    CiliumNetworkPolicy, Deployment, DeploymentStatus, DesiredState, Environment, Health, Instance,
    InstanceStatus, Sentinel, SentinelStatus, UnixMs,
};

use super::{Decision, Workflow};
use crate::app::deployments::DEPLOYMENT_NAMESPACE;

/// Most open deployments one round decides on.
pub const OPEN_DEPLOYMENTS_MAX: usize = 100_000;
/// Replicas of a sentinel a deploy creates for a production environment.
pub const SENTINEL_REPLICAS_PRODUCTION: u32 = 3;
/// Replicas of a sentinel a deploy creates for any other environment.
pub const SENTINEL_REPLICAS_OTHER: u32 = 1;
/// CPU per replica of a sentinel a deploy creates, in millicores.
pub const SENTINEL_CPU_MILLICORES: u32 = 250;
/// Memory per replica of a sentinel a deploy creates, in MiB.
pub const SENTINEL_MEMORY_MIB: u32 = 256;

/// What a decision reads about one deployment besides its record.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Its environment, if it has one yet.
    pub environment: Option<Environment>,
    /// Its reported instances, every region.
    pub instances: Vec<Instance>,
    /// Per target region, the environment's sentinel and its last status.
    pub sentinels: BTreeMap<String, (Sentinel, Option<SentinelStatus>)>,
}

/// The deploy workflow.
pub struct DeployWorkflow {
    settings: DeploySettings,
    /// When this leader took over (its first applied entry of its term).
    leader_since_ms: UnixMs,
}

impl DeployWorkflow {
    /// The workflow of a leader that took over at `leader_since_ms`.
    pub fn new(settings: DeploySettings, leader_since_ms: UnixMs) -> DeployWorkflow {
        DeployWorkflow {
            settings,
            leader_since_ms,
        }
    }

    /// Reads what [`decide_deploy`] needs of `deployment` from `view`.
    pub fn observe(view: &ReadView, deployment: &Deployment) -> Result<Observed, StorageError> {
        let mut sentinels = BTreeMap::new();
        for region in &deployment.regions {
            let found = view
                .region_sentinels(region, crate::app::sentinels::REGION_SCAN_MAX)?
                .into_iter()
                .find(|s| s.environment_id == deployment.environment_id);
            if let Some(sentinel) = found {
                let status = view.sentinel_status(&sentinel.id, region)?;
                sentinels.insert(region.clone(), (sentinel, status));
            }
        }
        Ok(Observed {
            environment: view.environment(&deployment.environment_id)?,
            instances: view.instances(&deployment.id)?,
            sentinels,
        })
    }
}

impl Workflow for DeployWorkflow {
    type Record = Deployment;

    fn name(&self) -> &'static str {
        "deploy"
    }

    fn open(&self, view: &ReadView) -> Result<Vec<Deployment>, StorageError> {
        view.open_deployments(OPEN_DEPLOYMENTS_MAX)
    }

    fn decide(
        &self,
        deployment: &Deployment,
        view: &ReadView,
        now_ms: UnixMs,
    ) -> Result<Decision, StorageError> {
        let observed = DeployWorkflow::observe(view, deployment)?;
        Ok(decide_deploy(
            deployment,
            &observed,
            &self.settings,
            self.leader_since_ms,
            now_ms,
        ))
    }
}

/// The deploy workflow's decision for `deployment` (pure).
pub fn decide_deploy(
    deployment: &Deployment,
    observed: &Observed,
    settings: &DeploySettings,
    leader_since_ms: UnixMs,
    now_ms: UnixMs,
) -> Decision {
    let transition = |action| {
        Decision::propose(vec![Mutation::Deploy(DeployTransition {
            deployment_id: deployment.id.clone(),
            expected: deploy_guard(deployment),
            action,
        })])
    };
    let status = deployment.status;
    if status.in_flight() {
        if let Some(by) = superseded_by(deployment, observed) {
            return transition(DeployAction::Supersede { by });
        }
        return decide_in_flight(deployment, observed, settings, leader_since_ms, now_ms)
            .map_or_else(
                |wake_at_ms| Decision {
                    proposals: Vec::new(),
                    wake_at_ms,
                },
                transition,
            );
    }
    if let Some(scheduled) = deployment.workflow.scheduled {
        if now_ms >= scheduled.at_ms {
            return transition(DeployAction::ApplySchedule);
        }
        return Decision::wake_at(scheduled.at_ms);
    }
    if !deployment.desired_state.runs()
        && status != DeploymentStatus::Stopped
        && !status.unsuccessful()
        && observed.instances.is_empty()
    {
        return transition(DeployAction::MarkStopped);
    }
    Decision::idle()
}

/// The deployment that supersedes `deployment`, if its environment's
/// latest attempt is another one (only deploys meant to go live are
/// superseded).
fn superseded_by(deployment: &Deployment, observed: &Observed) -> Option<String> {
    if !deployment.workflow.make_live {
        return None;
    }
    let latest = observed.environment.as_ref()?.latest_attempt.as_ref()?;
    (*latest != deployment.id).then(|| latest.clone())
}

/// The action for a deploy in flight, or (`Err`) when to look again.
fn decide_in_flight(
    deployment: &Deployment,
    observed: &Observed,
    settings: &DeploySettings,
    leader_since_ms: UnixMs,
    now_ms: UnixMs,
) -> Result<DeployAction, Option<UnixMs>> {
    let workflow = &deployment.workflow;
    if deployment.status == DeploymentStatus::Pending {
        return Ok(start(deployment, observed, settings));
    }
    let regions = region_counts(deployment, &observed.instances);

    // Progress and the failing regions, recorded before anything else.
    let running: u32 = regions.values().map(|r| r.running).sum();
    let mut failing = BTreeMap::new();
    for (region, counts) in &regions {
        if counts.all_failed() {
            let since = workflow
                .failing_since_ms
                .get(region)
                .copied()
                .unwrap_or(now_ms);
            failing.insert(region.clone(), since);
        }
    }
    let progressed = running > workflow.observed_running;
    if progressed || failing != workflow.failing_since_ms {
        let deadline_at_ms = if progressed {
            now_ms.saturating_add(workflow.progress_deadline_ms)
        } else {
            workflow.deadline_at_ms
        };
        return Ok(DeployAction::Observe {
            observed_running: running,
            deadline_at_ms,
            failing_since_ms: failing,
        });
    }

    // The step's own condition.
    match deployment.status {
        DeploymentStatus::Deploying => {
            let ready = regions
                .values()
                .filter(|r| r.running >= deployment.replicas)
                .count();
            if ready >= workflow.min_ready_regions as usize {
                return Ok(DeployAction::Advance {
                    to: DeploymentStatus::Network,
                    reason: format!(
                        "{ready} of {} regions run {} replicas",
                        deployment.regions.len(),
                        deployment.replicas
                    ),
                });
            }
        }
        DeploymentStatus::Network => {
            let unhealthy: Vec<&String> = deployment
                .regions
                .iter()
                .filter(|region| {
                    !matches!(
                        observed.sentinels.get(*region),
                        Some((_, Some(status))) if status.health == Health::Healthy
                    )
                })
                .collect();
            if unhealthy.is_empty() {
                return Ok(DeployAction::Advance {
                    to: DeploymentStatus::Finalizing,
                    reason: "the environment's sentinel is healthy in every region".into(),
                });
            }
        }
        DeploymentStatus::Finalizing => {
            return Ok(DeployAction::Finalize {
                standby_replaced_at_ms: now_ms.saturating_add(settings.live_grace_ms),
            });
        }
        _ => {}
    }

    // Failures, never before this leader's grace has passed.
    let grace_end_ms = leader_since_ms.saturating_add(settings.leader_grace_ms);
    let deadline_fires_at_ms = workflow.deadline_at_ms.max(grace_end_ms);
    let mut wake_at_ms = deadline_fires_at_ms;
    for (region, since) in &workflow.failing_since_ms {
        let fires_at_ms = since
            .saturating_add(workflow.fail_fast_ms)
            .max(grace_end_ms);
        if now_ms >= fires_at_ms {
            return Ok(DeployAction::Fail {
                reason: format!(
                    "every instance in {region} failed for {} s; {}",
                    workflow.fail_fast_ms / 1_000,
                    describe(deployment, &regions)
                ),
            });
        }
        wake_at_ms = wake_at_ms.min(fires_at_ms);
    }
    if now_ms >= deadline_fires_at_ms {
        return Ok(DeployAction::Fail {
            reason: format!(
                "no progress for {} s (the progress deadline) in {}; {}",
                workflow.progress_deadline_ms / 1_000,
                deployment.status.as_str(),
                describe(deployment, &regions)
            ),
        });
    }
    Err(Some(wake_at_ms))
}

/// The start of a pending deploy: its namespace, the environment's
/// sentinel for every region that has none, and its policies.
fn start(deployment: &Deployment, observed: &Observed, settings: &DeploySettings) -> DeployAction {
    let sentinels = deployment
        .regions
        .iter()
        .filter(|region| !observed.sentinels.contains_key(*region))
        .map(|region| new_sentinel(deployment, region, settings))
        .collect();
    let policies = deployment
        .regions
        .iter()
        .map(|region| policy(deployment, region))
        .collect();
    DeployAction::Start {
        k8s_namespace: DEPLOYMENT_NAMESPACE.to_string(),
        sentinels,
        policies,
    }
}

/// The sentinel a deploy creates for its environment in `region`: its id
/// derived from the environment, so every decision proposes the same one.
fn new_sentinel(deployment: &Deployment, region: &str, settings: &DeploySettings) -> Sentinel {
    let id = format!("snt_{}", deployment.environment_id);
    let production = deployment.environment_id.contains("prod");
    Sentinel {
        k8s_name: wire::k8s_name::sentinel(&id),
        k8s_namespace: wire::k8s_name::SENTINEL_NAMESPACE.to_string(),
        id,
        workspace_id: deployment.workspace_id.clone(),
        project_id: deployment.project_id.clone(),
        app_id: deployment.project_id.clone(),
        environment_id: deployment.environment_id.clone(),
        region: region.to_string(),
        image: settings.sentinel_image.clone(),
        cpu_millicores: SENTINEL_CPU_MILLICORES,
        memory_mib: SENTINEL_MEMORY_MIB,
        replicas: if production {
            SENTINEL_REPLICAS_PRODUCTION
        } else {
            SENTINEL_REPLICAS_OTHER
        },
        desired_state: DesiredState::Running,
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

/// The deployment's policy in `region`: ingress to its pods only from its
/// environment's sentinel.
fn policy(deployment: &Deployment, region: &str) -> CiliumNetworkPolicy {
    let id = wire::k8s_name::deployment_policy(&deployment.id);
    let document = serde_json::json!({
        "endpointSelector": {
            "matchLabels": { "deployment-id": deployment.id }
        },
        "ingress": [{
            "fromEndpoints": [{
                "matchLabels": {
                    "k8s:io.kubernetes.pod.namespace": wire::k8s_name::SENTINEL_NAMESPACE,
                    "environment-id": deployment.environment_id,
                }
            }]
        }]
    });
    CiliumNetworkPolicy {
        k8s_name: id.clone(),
        id,
        workspace_id: deployment.workspace_id.clone(),
        environment_id: deployment.environment_id.clone(),
        region: region.to_string(),
        k8s_namespace: DEPLOYMENT_NAMESPACE.to_string(),
        policy_json: document.to_string(),
        version: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

/// Instance counts of one region.
#[derive(Debug, Clone, Default)]
struct RegionCounts {
    running: u32,
    failed: u32,
    total: u32,
    /// `pod: state (reason)`, for a failure's message.
    pods: Vec<String>,
}

impl RegionCounts {
    fn all_failed(&self) -> bool {
        self.total > 0 && self.failed == self.total
    }
}

fn region_counts(
    deployment: &Deployment,
    instances: &[Instance],
) -> BTreeMap<String, RegionCounts> {
    let mut regions: BTreeMap<String, RegionCounts> = deployment
        .regions
        .iter()
        .map(|r| (r.clone(), RegionCounts::default()))
        .collect();
    for instance in instances {
        let Some(counts) = regions.get_mut(&instance.region) else {
            continue;
        };
        counts.total += 1;
        match instance.status {
            InstanceStatus::Running => counts.running += 1,
            InstanceStatus::Failed => counts.failed += 1,
            InstanceStatus::Pending => {}
        }
        let reason = instance
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        counts.pods.push(format!(
            "{} {}{reason}",
            instance.pod_name,
            instance.status.as_str()
        ));
    }
    regions
}

/// Each unready region and its pods' states, for a failure's reason.
fn describe(deployment: &Deployment, regions: &BTreeMap<String, RegionCounts>) -> String {
    let parts: Vec<String> = regions
        .iter()
        .filter(|(_, c)| c.running < deployment.replicas)
        .map(|(region, c)| {
            let pods = if c.pods.is_empty() {
                "no pods reported".to_string()
            } else {
                c.pods.join(", ")
            };
            format!(
                "{region}: {}/{} running ({pods})",
                c.running, deployment.replicas
            )
        })
        .collect();
    if parts.is_empty() {
        "every region runs its replicas".into()
    } else {
        parts.join("; ")
    }
}
