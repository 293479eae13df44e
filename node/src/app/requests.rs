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
use storage::mutations;

use storage::{Fingerprint, Mutation, MutationResult, Outcome, ReadView, StorageError};
use wire::notify::AddEndpoint;
use wire::operator::request::{
    ApplyPolicy, ApplySentinel, CancelDeployment, ControlRollout, CreateDeployment, DeletePolicy,
    RemoveNotifyEndpoint, ReplayDelivery, RevokeCertificate, Rollback, SetDesiredState,
    StartRollout, StopSentinel, UpdateDeployment,
};
use wire::operator::{
    EndpointRemoved, OperatorRequest, OperatorResponse, RequestId, SentinelDeployed,
};
use wire::{ErrorCode, WireError};

use super::dispatch::Dispatch;
use super::{
    Propose, ReadState, deployments, internal, notify, policies, revocations, rollouts, sentinels,
};
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
        .on(|s, apply: ApplyPolicy| policies::apply(s, apply))
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
        .on(|s, revoke: RevokeCertificate| revocations::revoke(s, revoke))
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
        let wrapped = Mutation::Request(mutations::Request {
            request_id: self.request_id.as_str().to_string(),
            fingerprint: self.fingerprint,
            actor: self.actor.to_string(),
            mutation: Box::new(mutation),
        });
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
mod tests;
