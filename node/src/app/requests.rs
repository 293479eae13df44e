//! Idempotent operator requests: a request that changes state and carries
//! a request id is applied once per id. Its one proposal is wrapped in a
//! [`Mutation::Request`] naming the id, the request's fingerprint (SHA-256
//! of its encoding without the id) and the caller, so apply records the
//! answer with the id in the same transaction, answers a retry with it and
//! refuses another request under the same id (`Conflict`).
//!
//! [`apply_once`] runs the request's rule over [`Idempotent`], the
//! [`Propose`] seam that wraps the proposal. A rule may answer without
//! proposing (a delete of a policy already gone, a stop of a stopped
//! sentinel, a request refused by a read): then, if this node has the id
//! recorded, the recorded answer stands — the request was applied before,
//! and its effect is what the rule's read saw.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use storage::{Fingerprint, Mutation, MutationResult, Outcome, ReadView, StorageError};
use wire::notify::AddEndpoint;
use wire::operator::request::{
    ApplyPolicy, ApplySentinel, CancelDeployment, ControlRollout, CreateDeployment, DeletePolicy,
    RemoveNotifyEndpoint, ReplayDelivery, Rollback, SetDesiredState, StartRollout, StopSentinel,
    UpdateDeployment,
};
use wire::operator::{
    EndpointRemoved, OperatorRequest, OperatorResponse, RequestId, SentinelDeployed,
};
use wire::{ErrorCode, WireError};

use super::dispatch::Dispatch;
use super::{Propose, ReadState, deployments, internal, notify, policies, rollouts, sentinels};
use crate::clock::Clock;
use config::DeploySettings;

/// The fingerprint of `request`: SHA-256 of its postcard encoding (the
/// request alone, without its id), each secret value replaced by its
/// keyed digest ([`transport::sealing::Keyring::keyed_digest`]) first: the
/// recorded fingerprint is no hash of a secret that guesses could be
/// tested against.
pub fn fingerprint(
    keyring: Option<&transport::sealing::Keyring>,
    request: &OperatorRequest,
) -> Result<Fingerprint, WireError> {
    let mut request = request.clone();
    if let OperatorRequest::CreateDeployment(create) = &mut request {
        for (name, value) in &mut create.spec.secret_env {
            if let wire::workload::SecretValue::Plain(text) = value {
                let mut data = name.as_bytes().to_vec();
                data.push(0);
                data.extend_from_slice(text.as_bytes());
                let digest = match keyring {
                    Some(keys) => keys.keyed_digest(&data),
                    // Refused anyway (no key to seal with); hide it still.
                    None => [0; 32],
                };
                *text = digest.iter().map(|b| format!("{b:02x}")).collect();
            }
        }
    }
    let bytes = postcard::to_allocvec(&request).map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("cannot encode the request: {e}"),
        )
    })?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    Fingerprint::try_from(digest.as_ref())
        .map_err(|_| WireError::new(ErrorCode::Internal, "a SHA-256 digest is not 32 bytes"))
}

/// Answers a state-changing request (see
/// [`OperatorRequest::is_mutating`]) by its rule, without a request id:
/// one table from request type to rule ([`Dispatch`]).
pub async fn apply<S: Propose + ReadState>(
    state: &S,
    clock: &dyn Clock,
    settings: &DeploySettings,
    request: OperatorRequest,
) -> Result<OperatorResponse, WireError> {
    if !request.is_mutating() {
        return Err(WireError::new(
            ErrorCode::Internal,
            format!("{} does not change state", request.name()),
        ));
    }
    Dispatch::new(state, request)
        .on(|s, create: CreateDeployment| deployments::create(s, clock, settings, create))
        .on(|s, r: SetDesiredState| {
            deployments::set_desired_state(s, clock, r.id, r.desired_state, r.after_ms, r.force)
        })
        .on(|s, CancelDeployment { id }| deployments::cancel(s, id))
        .on(|s, UpdateDeployment { id, update }| deployments::update(s, id, update))
        .on(|s, Rollback { environment_id, to }| deployments::rollback(s, environment_id, to))
        .on(|s, apply: ApplySentinel| async move {
            let d = sentinels::apply(s, apply).await?;
            Ok(SentinelDeployed {
                sentinel_id: d.sentinel_id,
                version: d.version,
                status: d.status,
            })
        })
        .on(|s, StopSentinel { id }| async move { sentinels::stop(s, &id).await.map(|()| id) })
        .on(|s, apply: ApplyPolicy| policies::apply(s, clock, apply))
        .on(|s, DeletePolicy { id }| async move { policies::delete(s, &id).await.map(|()| id) })
        .on(|s, start: StartRollout| rollouts::start(s, start))
        .on(|s, ControlRollout { command }| rollouts::control(s, command))
        .on(|s, add: AddEndpoint| notify::add(s, add))
        .on(|s, RemoveNotifyEndpoint { name }| async move {
            let deliveries_dead = notify::remove(s, name.clone()).await?;
            Ok(EndpointRemoved {
                name,
                deliveries_dead,
            })
        })
        .on(|s, ReplayDelivery { id }| notify::replay(s, id))
        .finish()
        .await
}

/// Answers a state-changing request made with `request_id` by `actor`:
/// applied once per id (see the module doc).
pub async fn apply_once<S: Propose + ReadState>(
    state: &S,
    clock: &dyn Clock,
    settings: &DeploySettings,
    request_id: &RequestId,
    actor: &str,
    request: OperatorRequest,
) -> Result<OperatorResponse, WireError> {
    request_id.validate()?;
    let fingerprint = fingerprint(state.keyring(), &request)?;
    let once = Idempotent {
        state,
        request_id,
        actor,
        fingerprint,
        proposed: AtomicBool::new(false),
    };
    let answer = apply(&once, clock, settings, request.clone()).await;
    if once.proposed.load(Ordering::Relaxed) {
        return answer;
    }
    let recorded = {
        let view = state.read().map_err(internal)?;
        view.request(request_id.as_str()).map_err(internal)?
    };
    match recorded {
        None => answer,
        Some(record) if record.fingerprint != fingerprint => Err(WireError::new(
            ErrorCode::Conflict,
            format!(
                "request id {request_id:?} was already used by {} for another request",
                record.actor
            ),
        )),
        Some(record) => replayed(&request, record.result).unwrap_or(answer),
    }
}

/// The answer of `request` from the result recorded for it, where the
/// result holds all of it (`None` otherwise).
fn replayed(
    request: &OperatorRequest,
    result: MutationResult,
) -> Option<Result<OperatorResponse, WireError>> {
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(e) => return Some(Err(e)),
    };
    let response = match (request, outcome) {
        (OperatorRequest::CreateDeployment(_), Outcome::DeploymentCreated { deployment_id }) => {
            OperatorResponse::Created { deployment_id }
        }
        (
            OperatorRequest::SetDesiredState(_)
            | OperatorRequest::CancelDeployment(_)
            | OperatorRequest::Rollback(_),
            Outcome::Deployment(deployment),
        ) => OperatorResponse::Updated(deployment),
        (OperatorRequest::StopSentinel(StopSentinel { id }), Outcome::Recorded) => {
            OperatorResponse::SentinelStopped {
                sentinel_id: id.clone(),
            }
        }
        (
            OperatorRequest::RemoveNotifyEndpoint(RemoveNotifyEndpoint { name }),
            Outcome::EndpointRemoved { deliveries_dead },
        ) => OperatorResponse::NotifyEndpointRemoved {
            name: name.clone(),
            deliveries_dead,
        },
        (
            OperatorRequest::ApplySentinel(_),
            Outcome::SentinelDeployed {
                sentinel_id,
                version,
                status,
            },
        ) => OperatorResponse::SentinelDeployed {
            sentinel_id,
            version,
            status,
        },
        (OperatorRequest::DeletePolicy(DeletePolicy { id }), Outcome::Recorded) => {
            OperatorResponse::PolicyDeleted {
                policy_id: id.clone(),
            }
        }
        _ => return None,
    };
    Some(Ok(response))
}

/// The seams of a request made with an id: its one proposal is wrapped in
/// a [`Mutation::Request`]; reads go to the state as they are.
pub struct Idempotent<'a, S> {
    state: &'a S,
    request_id: &'a RequestId,
    actor: &'a str,
    fingerprint: Fingerprint,
    /// Whether the request's proposal was made.
    proposed: AtomicBool,
}

impl<S: Propose> Propose for Idempotent<'_, S> {
    async fn propose(&self, mutations: Vec<Mutation>) -> Result<Vec<MutationResult>, WireError> {
        // One id answers one proposal: a second would be answered with the
        // first one's result.
        let once = || {
            WireError::new(
                ErrorCode::Internal,
                "a request with an id proposes one mutation, once",
            )
        };
        if self.proposed.swap(true, Ordering::Relaxed) {
            return Err(once());
        }
        let [mutation]: [Mutation; 1] = mutations.try_into().map_err(|_| once())?;
        let wrapped = Mutation::Request {
            request_id: self.request_id.as_str().to_string(),
            fingerprint: self.fingerprint,
            actor: self.actor.to_string(),
            mutation: Box::new(mutation),
        };
        self.state.propose(vec![wrapped]).await
    }
}

impl<S: ReadState> ReadState for Idempotent<'_, S> {
    fn read(&self) -> Result<ReadView, StorageError> {
        self.state.read()
    }

    fn applied_mark(&self) -> Option<u64> {
        self.state.applied_mark()
    }

    fn applied_past(&self, mark: Option<u64>, wait: Duration) -> impl Future<Output = bool> + Send {
        self.state.applied_past(mark, wait)
    }

    fn keyring(&self) -> Option<&transport::sealing::Keyring> {
        self.state.keyring()
    }
}

#[cfg(test)]
mod tests {
    use wire::model::DesiredState;
    use wire::operator::ApplyPolicy;

    use super::*;
    use crate::app::testing::{MemoryNode, create_request};

    const ACTOR: &str = "ctrl://operator";

    fn id(text: &str) -> RequestId {
        RequestId::parse(text).unwrap()
    }

    async fn once(
        node: &MemoryNode,
        request_id: &str,
        request: OperatorRequest,
    ) -> Result<OperatorResponse, WireError> {
        apply_once(
            node,
            node.clock(),
            &settings(),
            &id(request_id),
            ACTOR,
            request,
        )
        .await
    }

    fn settings() -> DeploySettings {
        DeploySettings::default()
    }

    fn create() -> OperatorRequest {
        OperatorRequest::CreateDeployment(create_request(&["us-east"]))
    }

    fn hash(node: &MemoryNode) -> u64 {
        node.read().unwrap().state_hash().unwrap()
    }

    fn deployments(node: &MemoryNode) -> usize {
        node.read()
            .unwrap()
            .list_deployments(None, 100)
            .unwrap()
            .len()
    }

    #[test]
    fn the_fingerprint_is_the_sha256_of_the_request_alone() {
        let a = fingerprint(None, &create()).unwrap();
        assert_eq!(a, fingerprint(None, &create()).unwrap(), "stable");
        let mut other = create_request(&["us-east"]);
        other.replicas = 2;
        assert_ne!(
            a,
            fingerprint(None, &OperatorRequest::CreateDeployment(other)).unwrap()
        );
        // SHA-256 of the postcard bytes, as ring computes it.
        let bytes = postcard::to_allocvec(&create()).unwrap();
        let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
        assert_eq!(&a[..], digest.as_ref());
    }

    #[tokio::test]
    async fn a_create_repeated_with_its_id_answers_the_first_deployment() {
        let node = MemoryNode::new();
        let first = once(&node, "r1", create()).await.unwrap();
        let OperatorResponse::Created { deployment_id } = &first else {
            panic!("{first:?}");
        };
        let before = hash(&node);
        // The retry mints another deployment id; the record answers.
        let again = once(&node, "r1", create()).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(hash(&node), before, "nothing written");
        assert_eq!(deployments(&node), 1);
        let record = node.read().unwrap().request("r1").unwrap().unwrap();
        assert_eq!(record.actor, ACTOR);
        assert_eq!(
            record.result,
            Ok(Outcome::DeploymentCreated {
                deployment_id: deployment_id.clone()
            })
        );
        // Another id is another request.
        once(&node, "r2", create()).await.unwrap();
        assert_eq!(deployments(&node), 2);
    }

    #[tokio::test]
    async fn the_same_id_for_another_request_is_a_conflict() {
        let node = MemoryNode::new();
        let OperatorResponse::Created { deployment_id } =
            once(&node, "r1", create()).await.unwrap()
        else {
            panic!("created");
        };
        let before = hash(&node);
        let stop = OperatorRequest::SetDesiredState(SetDesiredState {
            id: deployment_id,
            desired_state: DesiredState::Standby,
            after_ms: None,
            force: true,
        });
        let e = once(&node, "r1", stop).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict);
        assert!(
            e.message.contains("r1") && e.message.contains(ACTOR),
            "{}",
            e.message
        );
        assert_eq!(hash(&node), before);
    }

    #[tokio::test]
    async fn a_retried_delete_answers_as_the_first_though_the_policy_is_gone() {
        let node = MemoryNode::new();
        let apply = OperatorRequest::ApplyPolicy(ApplyPolicy {
            workspace_id: "ws".into(),
            environment_id: "env".into(),
            region: "us-east".into(),
            name: "web".into(),
            namespace: "apps".into(),
            policy_json: r#"{"endpointSelector":{}}"#.into(),
        });
        let OperatorResponse::PolicyApplied { policy_id } =
            once(&node, "a1", apply.clone()).await.unwrap()
        else {
            panic!("applied");
        };
        assert_eq!(
            once(&node, "a1", apply).await.unwrap(),
            OperatorResponse::PolicyApplied {
                policy_id: policy_id.clone()
            }
        );
        let delete = OperatorRequest::DeletePolicy(DeletePolicy {
            id: policy_id.clone(),
        });
        let first = once(&node, "d1", delete.clone()).await.unwrap();
        let proposals = node.proposals();
        // The policy is gone, so the rule refuses before proposing; the
        // record of the id answers instead.
        assert_eq!(once(&node, "d1", delete.clone()).await.unwrap(), first);
        assert_eq!(node.proposals(), proposals);
        // Without an id the same delete is NotFound; under another
        // request's id, a conflict.
        let e = apply_plain(&node, delete.clone()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        let e = once(&node, "a1", delete).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict);
    }

    async fn apply_plain(
        node: &MemoryNode,
        request: OperatorRequest,
    ) -> Result<OperatorResponse, WireError> {
        apply(node, node.clock(), &settings(), request).await
    }

    #[tokio::test]
    async fn a_refusal_is_recorded_and_answered_again() {
        let node = MemoryNode::new();
        let stop = OperatorRequest::SetDesiredState(SetDesiredState {
            id: "dep_missing".into(),
            desired_state: DesiredState::Standby,
            after_ms: None,
            force: true,
        });
        let e = once(&node, "r1", stop.clone()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(once(&node, "r1", stop).await.unwrap_err(), e);
    }

    #[tokio::test]
    async fn a_request_with_an_id_proposes_once() {
        let node = MemoryNode::new();
        let request_id = id("r1");
        let once = Idempotent {
            state: &node,
            request_id: &request_id,
            actor: ACTOR,
            fingerprint: [1; 32],
            proposed: AtomicBool::new(false),
        };
        let create = |i: usize| Mutation::CreateDeployment {
            deployment: wire::model::Deployment {
                id: format!("dep_{i}"),
                workspace_id: "ws".into(),
                project_id: "proj".into(),
                environment_id: "env".into(),
                image: "nginx".into(),
                cpu_millicores: 1,
                memory_mib: 1,
                replicas: 1,
                regions: vec!["us-east".into()],
                env_vars: Default::default(),
                desired_state: DesiredState::Running,
                status: wire::model::DeploymentStatus::Pending,
                created_at_ms: 1,
                updated_at_ms: 1,
                workflow: Default::default(),
                spec: Default::default(),
            },
        };
        let e = once.propose(vec![create(1), create(2)]).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal);
        assert_eq!(node.proposals(), 0);
        let e = once.propose(vec![create(3)]).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal, "the one proposal was spent");
    }

    #[tokio::test]
    async fn an_invalid_request_id_is_refused() {
        let node = MemoryNode::new();
        let bad: RequestId = postcard::from_bytes(&postcard::to_allocvec("a b").unwrap()).unwrap();
        let e = apply_once(&node, node.clock(), &settings(), &bad, ACTOR, create())
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(node.proposals(), 0);
    }

    #[test]
    fn a_fingerprint_hides_secret_values_behind_the_key() {
        let node = crate::app::testing::MemoryNode::new();
        let with = |value: &str| {
            let mut create = crate::app::testing::create_request(&["us-east"]);
            create.spec.secret_env.insert(
                "DB".into(),
                wire::workload::SecretValue::Plain(value.into()),
            );
            OperatorRequest::CreateDeployment(create)
        };
        let one = fingerprint(node.keyring(), &with("hunter2")).unwrap();
        assert_eq!(one, fingerprint(node.keyring(), &with("hunter2")).unwrap());
        assert_ne!(one, fingerprint(node.keyring(), &with("hunter3")).unwrap());
        let plain = postcard::to_allocvec(&with("hunter2")).unwrap();
        let bare = ring::digest::digest(&ring::digest::SHA256, &plain);
        assert_ne!(one.as_slice(), bare.as_ref(), "not a hash of the value");
    }
}
