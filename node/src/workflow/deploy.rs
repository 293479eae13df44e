//! The deploy workflow's decisions: for one deployment, from one view of
//! the state at one time, the guarded transition to propose next and when
//! to look again. Pure: no I/O, no clock; the driver passes the time in,
//! and the record's guard goes into every transition.
//!
//! The steps (storage's apply makes them; the guard, the records a start
//! writes and the sentinel id are [`wire::rules::deploy`]'s):
//!
//! - `pending`: superseded if its environment's latest attempt is another
//!   deployment; else start (topologies, the environment's sentinel per
//!   region, the deployment's policies).
//! - `deploying`: ready rule — at least `min_ready_regions` regions run
//!   every replica — then `network`.
//! - `network`: in every target region, the environment's sentinel healthy
//!   and the deployment's policies (ingress to it, egress from the
//!   sentinels to it) applied by krane at their current version, then
//!   `finalizing`.
//! - `finalizing`: becomes live (the replaced deployment goes to standby
//!   after the live grace), then `ready`.
//! - In flight, always: a rejection Kubernetes gave for the current
//!   version of its topology in a region, of its environment's sentinel or
//!   of its policies (krane's `ReportApply`) fails the deploy with that
//!   reason; more instances running is progress (the deadline
//!   moves); a region whose every instance failed for `fail_fast_ms` fails
//!   the deploy; the deadline passing fails it. Neither fires before
//!   `leader_grace_ms` after this leader took over.
//! - Out of flight: a scheduled desired-state change when it is due; a
//!   deployment that should not run and has no instance left is `stopped`.

use std::collections::{BTreeMap, BTreeSet};

use config::DeploySettings;
use storage::command::{DeployAction, DeployTransition, Touched};
use storage::{Mutation, ReadView, StorageError};
use wire::model::{
    Deployment, DeploymentStatus, Environment, Health, Instance, InstanceStatus, Pk, ResourceType,
    Sentinel, SentinelStatus, UnixMs,
};
use wire::rules::deploy::{
    DEPLOYMENT_NAMESPACE, deploy_guard, new_sentinel, policies, policy_ids, sentinel_id,
    workflow_open,
};

use super::{Decision, WorkKey, Workflow};

/// Most open deployments one round decides on.
pub const OPEN_DEPLOYMENTS_MAX: usize = 100_000;

/// What a decision reads about one deployment besides its record.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Its environment, if it has one yet.
    pub environment: Option<Environment>,
    /// Its reported instances, every region.
    pub instances: Vec<Instance>,
    /// Per target region, the environment's sentinel and its last status.
    pub sentinels: BTreeMap<String, (Sentinel, Option<SentinelStatus>)>,
    /// The deployment's policies in every target region.
    pub policies: Vec<PolicyState>,
    /// What Kubernetes rejected of the deploy's current versions, as krane
    /// reported it: its topology in a region, the environment's sentinel,
    /// one of its policies (one line each, naming the resource and region).
    pub rejected: Vec<String>,
}

/// One of a deployment's policies in one region, as stored and as krane
/// reported it applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyState {
    /// The policy's id.
    pub id: String,
    /// Its region.
    pub region: String,
    /// Its current version; `None` if it does not exist.
    pub version: Option<Pk>,
    /// The newest version krane reported applied, if any.
    pub applied: Option<Pk>,
}

impl PolicyState {
    /// Whether krane applied the policy's current version.
    pub fn is_applied(&self) -> bool {
        matches!((self.version, self.applied), (Some(v), Some(a)) if a >= v)
    }
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
            let likely_id = sentinel_id(&deployment.environment_id, region);
            if let Some(sentinel) =
                view.environment_sentinel(&deployment.environment_id, region, &likely_id)?
            {
                let status = view.sentinel_status(&sentinel.id, region)?;
                sentinels.insert(region.clone(), (sentinel, status));
            }
        }
        let mut rejected = Vec::new();
        for region in &deployment.regions {
            let key = |resource_type, id: &str| wire::model::ResourceKey {
                resource_type,
                resource_id: id.to_string(),
                region: region.clone(),
            };
            if let Some(topology) = view.topology(&deployment.id, region)?
                && let Some(report) = view.rejected(
                    &key(ResourceType::DeploymentTopology, &deployment.id),
                    topology.version,
                )?
                && let Some(why) = report.outcome.rejection()
            {
                rejected.push(format!("its pods in {region}: {why}"));
            }
            if let Some((sentinel, _)) = sentinels.get(region)
                && let Some(report) =
                    view.rejected(&key(ResourceType::Sentinel, &sentinel.id), sentinel.version)?
                && let Some(why) = report.outcome.rejection()
            {
                rejected.push(format!("sentinel {} in {region}: {why}", sentinel.id));
            }
        }
        let mut policies = Vec::new();
        for region in &deployment.regions {
            for id in policy_ids(&deployment.id) {
                let version = view.policy(&id, region)?.map(|p| p.version);
                let report = view.policy_applied(&id, region)?;
                let applied = report
                    .as_ref()
                    .filter(|a| a.outcome.is_applied())
                    .map(|a| a.version);
                if let (Some(version), Some(report)) = (version, &report)
                    && report.version >= version
                    && let Some(why) = report.outcome.rejection()
                {
                    rejected.push(format!("policy {id} in {region}: {why}"));
                }
                policies.push(PolicyState {
                    id,
                    region: region.clone(),
                    version,
                    applied,
                });
            }
        }
        Ok(Observed {
            environment: view.environment(&deployment.environment_id)?,
            instances: view.instances(&deployment.id)?,
            sentinels,
            policies,
            rejected,
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

    /// A deployment's own writes concern it; a write of its environment,
    /// of the environment's sentinel in a region or of one of its policies
    /// concerns every open deployment of the environment (found by key).
    /// Each environment and deployment is read once, however many of the
    /// round's writes name it.
    fn concerned(
        &self,
        view: &ReadView,
        touched: &BTreeSet<Touched>,
    ) -> Result<Vec<Deployment>, StorageError> {
        let mut ids = BTreeSet::new();
        let mut environments = BTreeSet::new();
        for touched in touched {
            match touched {
                Touched::Deployment(id) => {
                    ids.insert(id.clone());
                }
                Touched::Environment(id) => {
                    environments.insert(id.clone());
                }
                Touched::Sentinel { region, id } => {
                    environments.extend(view.sentinel(id, region)?.map(|s| s.environment_id));
                }
                Touched::Policy { region, id } => {
                    environments.extend(view.policy(id, region)?.map(|p| p.environment_id));
                }
                Touched::Rollout | Touched::Revocations => {}
            }
        }
        let mut concerned = Vec::new();
        for environment in &environments {
            for deployment in
                view.open_environment_deployments(environment, OPEN_DEPLOYMENTS_MAX)?
            {
                ids.remove(&deployment.id);
                concerned.push(deployment);
            }
        }
        for id in &ids {
            concerned.extend(view.deployment(id)?.filter(workflow_open));
        }
        Ok(concerned)
    }

    fn record(&self, view: &ReadView, key: &WorkKey) -> Result<Option<Deployment>, StorageError> {
        match key {
            WorkKey::Deployment(id) => Ok(view.deployment(id)?.filter(workflow_open)),
            _ => Ok(None),
        }
    }

    fn key(&self, deployment: &Deployment) -> WorkKey {
        WorkKey::Deployment(deployment.id.clone())
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
    // Kubernetes refused what this deploy wrote: final for these versions,
    // no deadline to wait for (a leader's grace is for what it has not
    // seen yet; a recorded rejection has been seen).
    if !observed.rejected.is_empty() {
        return Ok(DeployAction::Fail {
            reason: format!("Kubernetes rejected {}", observed.rejected.join("; ")),
        });
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
        DeploymentStatus::Network if network_waits(deployment, observed).is_empty() => {
            return Ok(DeployAction::Advance {
                to: DeploymentStatus::Finalizing,
                reason: "the environment's sentinel is healthy and the deployment's policies \
                         are applied in every region"
                    .into(),
            });
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
                    "every instance in {region} failed for {}; {}",
                    humantime::format_duration(std::time::Duration::from_millis(
                        workflow.fail_fast_ms
                    )),
                    describe(deployment, &regions)
                ),
            });
        }
        wake_at_ms = wake_at_ms.min(fires_at_ms);
    }
    if now_ms >= deadline_fires_at_ms {
        let waiting = match deployment.status {
            DeploymentStatus::Network => network_waits(deployment, observed).join("; "),
            _ => describe(deployment, &regions),
        };
        return Ok(DeployAction::Fail {
            reason: format!(
                "no progress for {} s (the progress deadline) in {}; {waiting}",
                workflow.progress_deadline_ms / 1_000,
                deployment.status.as_str(),
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
        .map(|region| new_sentinel(deployment, region, &settings.sentinel_image))
        .collect();
    let policies = deployment
        .regions
        .iter()
        .flat_map(|region| policies(deployment, region))
        .collect();
    DeployAction::Start {
        k8s_namespace: DEPLOYMENT_NAMESPACE.to_string(),
        sentinels,
        policies,
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

/// What the `network` step waits for, one line each: a target region
/// whose environment sentinel is not healthy, a policy not applied at its
/// current version. Empty: the step is done.
fn network_waits(deployment: &Deployment, observed: &Observed) -> Vec<String> {
    let mut waits = Vec::new();
    for region in &deployment.regions {
        match observed.sentinels.get(region) {
            Some((_, Some(status))) if status.health == Health::Healthy => {}
            Some((sentinel, Some(status))) => waits.push(format!(
                "{region}: sentinel {} is {}",
                sentinel.id,
                status.health.as_str()
            )),
            Some((sentinel, None)) => {
                waits.push(format!("{region}: sentinel {} not reported", sentinel.id));
            }
            None => waits.push(format!("{region}: no sentinel for the environment")),
        }
    }
    for policy in observed.policies.iter().filter(|p| !p.is_applied()) {
        let state = match (policy.version, policy.applied) {
            (None, _) => "missing".to_string(),
            (Some(v), None) => format!("version {v} not applied"),
            (Some(v), Some(a)) => format!("version {v} not applied (applied: {a})"),
        };
        waits.push(format!("{}: policy {} {state}", policy.region, policy.id));
    }
    waits
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

#[cfg(test)]
mod tests;
