//! The operations: a random mix of operator requests, each with a request
//! id of its own, sent one after another; a try whose answer is lost (no
//! node answered, a timeout, an error another try may not get) is sent
//! again with the same id, as the CLI does, until [`OP_TIMEOUT`]. Each
//! operation is recorded with its outcome: acknowledged (with the
//! answer), refused (a node's definite error, e.g. a rollback with no
//! previous deployment), or unknown (never answered).

use std::time::Duration;

use node::client::{Client, ClientError};
use tokio::time::Instant;
use wire::ErrorCode;
use wire::model::DesiredState;
use wire::operator::request::{
    ControlRollout, DeletePolicy, Rollback, RolloutStatus, SetDesiredState,
};
use wire::operator::{
    ApplyPolicy, OperatorRequest, OperatorResponse, RequestId, RolloutCommand, StartRollout,
};
use wire::rollout::{Rollout, RolloutOptions, RolloutState};

use crate::rng::Rng;

/// The regions deployed to, each with a simulated cluster and a krane.
pub(crate) const REGIONS: [&str; 2] = ["us-east", "eu-west"];
/// The environments operations pick from.
pub(crate) const ENVIRONMENTS: [&str; 3] = ["chaos-a", "chaos-b", "chaos-c"];
/// Workspace, project and app of everything created.
pub(crate) const WORKSPACE: &str = "ws-chaos";
/// The project of everything created.
pub(crate) const PROJECT: &str = "proj-chaos";
/// The app of the sentinels applied.
pub(crate) const APP: &str = "app";
/// Images that run.
pub(crate) const IMAGES: [&str; 2] = ["nginx:1.27", "nginx:1.28"];
/// The image whose pods never start (the simulators are told so).
pub(crate) const BROKEN_IMAGE: &str = "chaos/broken:1";
/// The image every simulated cluster's admission webhook denies
/// ([`crate::refusals`]).
pub(crate) const DENIED_IMAGE: &str = "chaos/denied:1";
/// The policy name someone else's object holds in one region, in every
/// environment's namespace ([`crate::refusals`]).
pub(crate) const HELD_POLICY: &str = "chaos-held";
/// An environment variable name Kubernetes (and so ctrl) refuses.
pub(crate) const INVALID_ENV_NAME: &str = "1CHAOS-INVALID";
/// Names of the policies applied and deleted (someone else holds the
/// last one in one region).
pub(crate) const POLICY_NAMES: [&str; 3] = ["chaos-allow-a", "chaos-allow-b", HELD_POLICY];
/// The environment variable marking a create with its operation number.
pub(crate) const OP_MARKER: &str = "CHAOS_OP";
/// A deploy's progress deadline, in milliseconds (a broken image fails
/// within it).
pub(crate) const PROGRESS_DEADLINE_MS: u64 = 8_000;
/// A sentinel change's deadline, in milliseconds.
pub(crate) const SENTINEL_DEADLINE_MS: u64 = 60_000;
/// A rollout wave's bake, in milliseconds.
pub(crate) const ROLLOUT_BAKE_MS: u64 = 500;
/// A rollout's sentinel deadline, in milliseconds: a wave of the broken
/// image pauses the rollout after it.
pub(crate) const ROLLOUT_DEADLINE_MS: u64 = 15_000;
/// Percent of deploys of the broken image, of the denied image, and with
/// an invalid variable name.
const DEPLOY_BROKEN_PERCENT: u64 = 15;
const DEPLOY_DENIED_PERCENT: u64 = 10;
const DEPLOY_INVALID_PERCENT: u64 = 5;
/// Percent of rollouts started with the broken image.
const ROLLOUT_BROKEN_PERCENT: u64 = 35;
/// Bound on one operation, its retries included.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one try (the client's own tries, one per node, included).
pub(crate) const TRY_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause before sending an unanswered operation again.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Longest pause between two operations, in milliseconds.
pub(crate) const OP_GAP_MS_MAX: u64 = 300;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A new deployment (sometimes of the broken or the denied image).
    Deploy,
    /// A new deployment with a variable name Kubernetes refuses: ctrl
    /// must refuse it.
    DeployInvalid,
    /// A deployment put in standby.
    Stop,
    /// A deployment set running.
    Start,
    /// An environment rolled back to its previous live deployment.
    Rollback,
    /// A sentinel created or changed.
    SentinelApply,
    /// A policy created or replaced.
    PolicyApply,
    /// A policy deleted.
    PolicyDelete,
    /// A fleet rollout of a sentinel image (sometimes the broken one),
    /// started when none is in progress.
    RolloutStart,
    /// The paused rollout resumed.
    RolloutResume,
    /// The rollout in progress or paused cancelled.
    RolloutCancel,
    /// The paused or cancelled rollout rolled back.
    RolloutRollbackAll,
}

impl Kind {
    /// The operations and how often each is picked.
    /// Every rollout kind is picked as `RolloutStart`, and becomes what
    /// the latest rollout's state allows ([`rollout_request`]).
    const MIX: [(Kind, u64); 8] = [
        (Kind::Deploy, 30),
        (Kind::Stop, 10),
        (Kind::Start, 10),
        (Kind::Rollback, 8),
        (Kind::SentinelApply, 12),
        (Kind::PolicyApply, 12),
        (Kind::PolicyDelete, 8),
        (Kind::RolloutStart, 14),
    ];

    /// Its name in the figures.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Deploy => "deploy",
            Kind::DeployInvalid => "deploy_invalid",
            Kind::Stop => "stop",
            Kind::Start => "start",
            Kind::Rollback => "rollback",
            Kind::SentinelApply => "sentinel_apply",
            Kind::PolicyApply => "policy_apply",
            Kind::PolicyDelete => "policy_delete",
            Kind::RolloutStart => "rollout_start",
            Kind::RolloutResume => "rollout_resume",
            Kind::RolloutCancel => "rollout_cancel",
            Kind::RolloutRollbackAll => "rollout_rollback_all",
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Answered with this.
    Acked(Box<OperatorResponse>),
    /// Refused by a node (a definite error, nothing applied).
    Refused(wire::WireError),
    /// No answer within [`OP_TIMEOUT`]: it may or may not have been applied.
    Unknown(String),
}

/// One operation sent.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    /// Its number (from 1).
    pub(crate) n: u64,
    /// What it does.
    pub(crate) kind: Kind,
    /// The request id every try carried.
    pub(crate) request_id: String,
    /// The request.
    pub(crate) request: OperatorRequest,
    /// How it ended.
    pub(crate) outcome: Outcome,
    /// Tries made.
    pub(crate) tries: u32,
}

impl Op {
    /// The answer, if acknowledged.
    pub(crate) fn acked(&self) -> Option<&OperatorResponse> {
        match &self.outcome {
            Outcome::Acked(response) => Some(response.as_ref()),
            _ => None,
        }
    }
}

/// Sends operations until `until`; every operation sent, in order.
pub(crate) async fn drive(client: &Client, rng: &mut Rng, until: Instant) -> Vec<Op> {
    let mut ops: Vec<Op> = Vec::new();
    while Instant::now() < until {
        let n = u64::try_from(ops.len())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let Some(kind) = rng.weighted(&Kind::MIX) else {
            continue;
        };
        let latest = if kind == Kind::RolloutStart {
            match latest_rollout(client).await {
                Some(latest) => latest,
                None => continue,
            }
        } else {
            None
        };
        let Some((kind, request)) = next(rng, &ops, n, kind, latest.as_ref()) else {
            tokio::time::sleep(rng.between_ms(0, OP_GAP_MS_MAX)).await;
            continue;
        };
        let request_id = node::client::new_request_id();
        let (outcome, tries) = send(client, &request, &request_id).await;
        ops.push(Op {
            n,
            kind,
            request_id: request_id.as_str().to_string(),
            request,
            outcome,
            tries,
        });
        tokio::time::sleep(rng.between_ms(0, OP_GAP_MS_MAX)).await;
    }
    ops
}

/// The latest rollout as a node answers now (`Some(None)`: none ever);
/// `None` when no node answered in time (the pick is skipped).
async fn latest_rollout(client: &Client) -> Option<Option<Rollout>> {
    tokio::time::timeout(TRY_TIMEOUT, client.call(RolloutStatus))
        .await
        .ok()?
        .ok()
}

/// Sends `request` under `request_id` until it is answered or refused, or
/// [`OP_TIMEOUT`] passes. Sent untyped: the mix is generated, and its
/// answer is recorded as it came.
async fn send(
    client: &Client,
    request: &OperatorRequest,
    request_id: &RequestId,
) -> (Outcome, u32) {
    let deadline = Instant::now() + OP_TIMEOUT;
    let mut tries = 0;
    loop {
        tries += 1;
        let answer = tokio::time::timeout(
            TRY_TIMEOUT,
            client.send_with_id(request, Some(request_id.clone())),
        )
        .await;
        let lost = match answer {
            Ok(Ok(response)) => return (Outcome::Acked(Box::new(response)), tries),
            Ok(Err(ClientError::Server(e))) if definite(e.code) => {
                return (Outcome::Refused(e), tries);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {TRY_TIMEOUT:?}"),
        };
        if Instant::now() + RETRY_PAUSE >= deadline {
            return (Outcome::Unknown(lost), tries);
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Errors a node gives for the request itself (another try gets the
/// same); the others (unavailable, internal, a lost leader) are tried
/// again.
fn definite(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::BadRequest
            | ErrorCode::NotFound
            | ErrorCode::PermissionDenied
            | ErrorCode::Conflict
            | ErrorCode::FailedPrecondition
            | ErrorCode::VersionMismatch
    )
}

/// The deployments created so far (acknowledged), as (id, environment).
fn created(ops: &[Op]) -> Vec<(String, String)> {
    ops.iter()
        .filter_map(|op| match (op.acked(), &op.request) {
            (
                Some(OperatorResponse::Created { deployment_id }),
                OperatorRequest::CreateDeployment(create),
            ) => Some((deployment_id.clone(), create.environment_id.clone())),
            _ => None,
        })
        .collect()
}

/// The policies applied so far (acknowledged), by id.
fn policies(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .filter_map(|op| match op.acked() {
            Some(OperatorResponse::PolicyApplied { policy_id }) => Some(policy_id.clone()),
            _ => None,
        })
        .collect()
}

/// The next operation, chosen by `rng` (`None`: the kind chosen has
/// nothing to act on yet).
fn next(
    rng: &mut Rng,
    ops: &[Op],
    n: u64,
    kind: Kind,
    latest: Option<&Rollout>,
) -> Option<(Kind, OperatorRequest)> {
    let mut chosen = kind;
    let environment = (*rng.pick(&ENVIRONMENTS)?).to_string();
    let region = (*rng.pick(&REGIONS)?).to_string();
    let request: OperatorRequest = match kind {
        Kind::Deploy => {
            let regions: Vec<&str> = match rng.below(3) {
                0 => vec![REGIONS[0]],
                1 => vec![REGIONS[1]],
                _ => REGIONS.to_vec(),
            };
            let roll = rng.below(100);
            let image = if roll < DEPLOY_BROKEN_PERCENT {
                BROKEN_IMAGE
            } else if roll < DEPLOY_BROKEN_PERCENT + DEPLOY_DENIED_PERCENT {
                DENIED_IMAGE
            } else {
                rng.pick(&IMAGES)?
            };
            let invalid = roll >= 100 - DEPLOY_INVALID_PERCENT;
            let replicas = u32::try_from(1 + rng.below(2)).unwrap_or(1);
            let mut request = integration::requests::deployment(regions)
                .owner(WORKSPACE, PROJECT, &environment)
                .image(image)
                .replicas(replicas)
                .progress_deadline_ms(PROGRESS_DEADLINE_MS)
                .env_var(OP_MARKER, n.to_string());
            if invalid {
                chosen = Kind::DeployInvalid;
                request = request.env_var(INVALID_ENV_NAME, "x");
            }
            request.request()
        }
        Kind::DeployInvalid => return None,
        Kind::Stop | Kind::Start => {
            let deployments = created(ops);
            let (id, _) = rng.pick(&deployments)?;
            SetDesiredState {
                id: id.clone(),
                desired_state: if kind == Kind::Stop {
                    DesiredState::Standby
                } else {
                    DesiredState::Running
                },
                after_ms: None,
                force: true,
            }
            .into()
        }
        Kind::Rollback => Rollback {
            environment_id: environment,
            to: None,
        }
        .into(),
        Kind::SentinelApply => integration::requests::sentinel(environment, region)
            .owner(WORKSPACE, PROJECT, APP)
            .image(*rng.pick(&IMAGES)?)
            .replicas(1)
            .deadline_ms(SENTINEL_DEADLINE_MS)
            .build()
            .into(),
        Kind::PolicyApply => ApplyPolicy {
            workspace_id: WORKSPACE.into(),
            environment_id: environment.clone(),
            region,
            name: (*rng.pick(&POLICY_NAMES)?).to_string(),
            // Each environment its own namespace: ctrl accepts two
            // environments' policies naming one object, which then fight
            // over it (reported, not exercised here).
            namespace: environment.clone(),
            policy_json: format!(
                r#"{{"endpointSelector":{{"matchLabels":{{"chaos-op":"{n}"}}}}}}"#
            ),
        }
        .into(),
        Kind::PolicyDelete => {
            let applied = policies(ops);
            DeletePolicy {
                id: rng.pick(&applied)?.clone(),
            }
            .into()
        }
        Kind::RolloutStart
        | Kind::RolloutResume
        | Kind::RolloutCancel
        | Kind::RolloutRollbackAll => {
            let (picked, request) = rollout_request(rng, latest)?;
            chosen = picked;
            request
        }
    };
    Some((chosen, request))
}

/// What to do to the fleet rollout, given the latest one: start one
/// when none is in progress (a third of them of the broken image, which
/// pauses it), or resume, cancel or roll back the one there is, as its
/// state allows (`None`: nothing to do now).
fn rollout_request(rng: &mut Rng, latest: Option<&Rollout>) -> Option<(Kind, OperatorRequest)> {
    let control = |command| {
        let kind = match command {
            RolloutCommand::Resume => Kind::RolloutResume,
            RolloutCommand::Cancel => Kind::RolloutCancel,
            RolloutCommand::RollbackAll => Kind::RolloutRollbackAll,
        };
        Some((kind, ControlRollout { command }.into()))
    };
    match latest.map(|r| (r.state, r)) {
        Some((RolloutState::Paused, _)) => match rng.below(100) {
            0..40 => control(RolloutCommand::Resume),
            40..65 => control(RolloutCommand::Cancel),
            _ => control(RolloutCommand::RollbackAll),
        },
        Some((RolloutState::InProgress, _)) => {
            if rng.chance(20) {
                control(RolloutCommand::Cancel)
            } else {
                None
            }
        }
        Some((RolloutState::RollingBack, _)) => None,
        Some((RolloutState::Cancelled, r))
            if r.reverted == 0
                && r.members.iter().any(wire::rules::rollout::took_image)
                && rng.chance(40) =>
        {
            control(RolloutCommand::RollbackAll)
        }
        _ => {
            let image = if rng.chance(ROLLOUT_BROKEN_PERCENT) {
                BROKEN_IMAGE
            } else {
                *rng.pick(&IMAGES)?
            };
            let request = StartRollout {
                options: RolloutOptions {
                    image: image.to_string(),
                    wave_percents: vec![50, 100],
                    bake_ms: ROLLOUT_BAKE_MS,
                    max_failures: 0,
                    concurrency: 0,
                    deadline_ms: ROLLOUT_DEADLINE_MS,
                    notify: None,
                },
            };
            Some((Kind::RolloutStart, request.into()))
        }
    }
}
