//! The mutation path: [`Store::apply`] applies a batch of Raft entries in one
//! redb write transaction, together with the Raft metadata. It is the one
//! place replicated state is written (snapshot import aside, which replaces
//! it whole).
//!
//! Each mutation first validates against the state (reads only), then
//! writes; a domain failure is returned as a `WireError` before anything is
//! written, so a rejected mutation leaves nothing of itself. Every write of
//! desired state goes through `Applier::record_change`, which assigns the
//! next pk and writes the change row and its region index row.
//!
//! This module holds the dispatcher; each resource's mutations live in a
//! module of their own, as methods of the one `Applier` of the batch. The
//! pure rules they share with the leader's deciders (guards, record
//! constructors, the rollout's plan and steps) live in [`wire::rules`]; a
//! guarded transition whose record moved on is refused here
//! (`guard_refusal`).
//!
//! - `deployment`: deployments and their per-region topologies (create,
//!   desired state, the deploy's start and cleanup).
//! - `environment`: environments, their live deployment, rollback.
//! - `instances`: instance reports of a deployment's regions.
//! - `sentinel`: sentinels, their reported status, and the tracked
//!   deploy of a sentinel change (ready at the apply of the report that
//!   shows it converged, failed by a guarded transition past its deadline).
//! - `rollout`: fleet rollouts of a sentinel image (the plan frozen at
//!   start, operators' commands, the driver's guarded steps, the sentinel
//!   writes they make).
//! - `cilium`: cilium network policies.
//! - `region`: regions (add, cordon, heartbeats) and which regions a
//!   deployment may name.
//! - `route`: an environment's route per region, rewritten with every
//!   change of its live deployment and flipped by the instance report that
//!   shows the wanted deployment running.
//! - `revocation`: revoked certificate targets.
//! - `change_log`: pk assignment, change and index rows, compaction.
//! - `requests`: operator requests made with an id — the record of each
//!   id's answer, replays, conflicts, eviction and retention.
//! - `meta`: what every batch commits besides its mutations: the pk
//!   counter, the compaction floor, the Raft applied log id and membership.
//! - `workflow`: the deploy workflow's record writes and its guarded
//!   transitions: its steps, its step records and its journal.
//! - `notify`: webhook endpoints and notification deliveries: the
//!   deliveries an event creates (in the transaction of the transition it
//!   announces), their guarded attempts, replays, and the table's bound.
//! - `write_tables`: every table opened for writing (shared with snapshot
//!   import).
//!
//! # Serialized formats
//!
//! Every row apply writes is a postcard encoding of a `wire` or `storage`
//! type, pinned by golden bytes (`storage/tests/golden.rs`) under
//! [`crate::SCHEMA_VERSION`]: enum variants are append-only, and a new field
//! (or any other change of an encoding) needs a version bump.

mod change_log;
mod cilium;
mod deployment;
mod environment;
mod instances;
mod meta;
mod notify;
mod region;
mod requests;
mod revocation;
mod rollout;
mod route;
mod sentinel;
mod workflow;
mod write_tables;

#[cfg(test)]
mod tests;
use std::collections::BTreeSet;

use redb::Durability;
use wire::model::{Pk, UnixMs};
use wire::{ErrorCode, WireError};

use crate::Store;
use crate::command::{
    ApplyEntry, ApplyResult, Caller, Command, Guard, Mutation, MutationResult, Outcome, RaftMeta,
    Touched,
};
use crate::error::{RedbContext, Result};

pub(crate) use cilium::policy_name_key;
pub(crate) use write_tables::WriteTables;

/// The operation named in the errors of apply.
const OP: &str = "apply";

impl Store {
    /// Applies Raft entries in order, in ONE write transaction that also
    /// stores `raft` (the metadata after the last entry). Returns, per
    /// entry, the outcome of each mutation, and the new `last_pk`.
    ///
    /// `durable = false` commits with redb's `Durability::None`: visible to
    /// readers at once, persisted by the next durable commit or clean close,
    /// lost on a crash (the Raft log re-applies it). A `StorageError` means
    /// nothing of the batch was committed and the state machine must stop.
    pub fn apply(
        &self,
        entries: &[ApplyEntry<'_>],
        raft: &RaftMeta,
        durable: bool,
    ) -> Result<ApplyResult> {
        // Held across the commit: a recount sees this batch wholly or not.
        let mut counts = self.lock_counts();
        let mut txn = self.db.begin_write().ctx("apply: begin transaction")?;
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .ctx("apply: set durability")?;
        let (outcomes, last_pk, stamp_ms, delta, touched) = {
            let mut applier = Applier::new(WriteTables::open(&txn, OP)?, self.requests_max)?;
            applier.deliveries_max = self.deliveries_max;
            let mut outcomes = Vec::with_capacity(entries.len());
            for entry in entries {
                outcomes.push(match entry {
                    Some(command) => applier.command(command)?,
                    None => Vec::new(),
                });
            }
            applier.finish(raft)?;
            (
                outcomes,
                applier.last_pk,
                applier.stamp_ms,
                applier.counts,
                applier.touched,
            )
        };
        txn.commit().ctx("apply: commit")?;
        if let Some(counts) = counts.as_mut() {
            counts.add(&delta);
        }
        self.touched.add(touched.clone());
        Ok(ApplyResult {
            outcomes,
            last_pk,
            stamp_ms,
            touched,
        })
    }
}

/// Applies mutations against open tables; holds the pk counter and the
/// floor until [`Applier::finish`] writes them back. Each resource's module
/// adds its mutations as methods.
struct Applier<'t> {
    t: WriteTables<'t>,
    last_pk: Pk,
    floor_pk: Pk,
    /// The sequence number of the newest journal entry.
    journal_seq: u64,
    /// The time of the command being applied: its `now_ms`, or
    /// `stamp_ms` when the command was stamped earlier than that.
    now_ms: UnixMs,
    /// The greatest time applied so far (stored under `meta::STAMP_MS`).
    stamp_ms: UnixMs,
    /// Who asked for the mutation being applied, while the inner mutation
    /// of a [`Mutation::Request`] applies (`None` otherwise): for apply
    /// code that records who asked.
    caller: Option<Caller>,
    /// Most request records kept ([`crate::REQUESTS_MAX`]).
    requests_max: u64,
    /// Most deliveries kept ([`crate::DELIVERIES_MAX`]).
    deliveries_max: u64,
    /// What the batch changed in the store's [`crate::Counts`].
    counts: crate::counts::CountDelta,
    /// The records the batch wrote that a workflow decision reads.
    touched: BTreeSet<Touched>,
}

impl Applier<'_> {
    fn command(&mut self, command: &Command) -> Result<Vec<MutationResult>> {
        // Applied time never goes backwards: a leader whose clock jumped
        // back (or a new leader whose clock is behind) applies at the
        // last applied time.
        self.now_ms = command.now_ms.max(self.stamp_ms);
        self.stamp_ms = self.now_ms;
        command
            .mutations
            .iter()
            .map(|mutation| self.mutation(mutation))
            .collect()
    }

    fn mutation(&mut self, mutation: &Mutation) -> Result<MutationResult> {
        match mutation {
            Mutation::CreateDeployment(crate::mutations::CreateDeployment { deployment }) => {
                self.create_deployment(deployment)
            }
            Mutation::SetDesiredState(crate::mutations::SetDesiredState {
                deployment_id,
                desired_state,
                at_ms,
                force,
            }) => self.set_desired_state(deployment_id, *desired_state, *at_ms, *force),
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id,
                region,
                instances,
            }) => self.report_instances(deployment_id, region, instances),
            Mutation::ReportDeploymentDeleted(crate::mutations::ReportDeploymentDeleted {
                deployment_id,
                region,
            }) => self.report_deployment_deleted(deployment_id, region),
            Mutation::UpsertSentinel(sentinel) => self.upsert_sentinel(sentinel),
            Mutation::ReportSentinelStatus(status) => self.report_sentinel_status(status),
            Mutation::UpsertCiliumNetworkPolicy(policy) => self.upsert_operator_policy(policy),
            Mutation::DeleteCiliumNetworkPolicy(crate::mutations::DeleteCiliumNetworkPolicy {
                id,
                region,
            }) => self.delete_policy(id, region),
            Mutation::ReportApply(result) => self.report_apply(result),
            Mutation::Compact(crate::mutations::Compact {
                created_before_ms,
                rows_max,
                requests_created_before_ms,
                keep_rows_min,
            }) => self.compact(
                *created_before_ms,
                *rows_max,
                *requests_created_before_ms,
                *keep_rows_min,
            ),
            Mutation::Deploy(transition) => self.deploy_transition(transition),
            Mutation::CancelDeployment(crate::mutations::CancelDeployment { deployment_id }) => {
                self.cancel_deployment(deployment_id)
            }
            Mutation::Rollback(crate::mutations::Rollback { environment_id, to }) => {
                self.rollback(environment_id, to.as_deref())
            }
            Mutation::AddRegion(crate::mutations::AddRegion { name }) => self.add_region(name),
            Mutation::SetRegionSchedulable(crate::mutations::SetRegionSchedulable {
                name,
                schedulable,
            }) => self.set_region_schedulable(name, *schedulable),
            Mutation::RecordHeartbeat(crate::mutations::RecordHeartbeat { region, heartbeat }) => {
                self.record_heartbeat(region, heartbeat)
            }
            Mutation::Request(crate::mutations::Request {
                request_id,
                fingerprint,
                actor,
                mutation,
            }) => self.request(request_id, fingerprint, actor, mutation),
            Mutation::AddNotifyEndpoint(endpoint) => self.add_notify_endpoint(endpoint),
            Mutation::RemoveNotifyEndpoint(crate::mutations::RemoveNotifyEndpoint { name }) => {
                self.remove_notify_endpoint(name)
            }
            Mutation::Deliver(transition) => self.delivery_transition(transition),
            Mutation::ReplayDelivery(crate::mutations::ReplayDelivery { delivery_id }) => {
                self.replay_delivery(*delivery_id)
            }
            Mutation::DeploySentinel(crate::mutations::DeploySentinel {
                sentinel,
                deadline_ms,
            }) => self.deploy_sentinel(sentinel, *deadline_ms),
            Mutation::Sentinel(transition) => self.sentinel_transition(transition),
            Mutation::StartRollout(options) => self.start_rollout(options),
            Mutation::ControlRollout(command) => self.control_rollout(*command),
            Mutation::Rollout(transition) => self.rollout_transition(transition),
            Mutation::UpdateDeployment(crate::mutations::UpdateDeployment {
                deployment_id,
                update,
            }) => self.update_deployment(deployment_id, update),
            Mutation::SetClusterIdentity(identity) => self.set_cluster_identity(identity),
            Mutation::PatchSentinel(crate::mutations::PatchSentinel { patch, deadline_ms }) => {
                self.patch_sentinel(patch, *deadline_ms)
            }
            Mutation::Revoke(crate::mutations::Revoke { target, reason }) => {
                self.revoke(target, reason)
            }
        }
    }
}

impl Applier<'_> {
    /// Notes that the batch wrote `record` (see [`ApplyResult::touched`]).
    fn touch(&mut self, record: Touched) {
        self.touched.insert(record);
    }
}

/// The answer to a transition decided against `expected`, when the record
/// has guard `found` (`None`: no record): `None` if the guard holds (make
/// the transition), else the [`Outcome::GuardFailed`] to answer with.
fn guard_refusal(expected: &Guard, found: Option<Guard>) -> Option<Outcome> {
    match found {
        Some(found) if found == *expected => None,
        found => Some(Outcome::GuardFailed {
            expected: expected.clone(),
            found,
        }),
    }
}

fn bad_request(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::BadRequest, message))
}

fn conflict(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::Conflict, message))
}

fn not_found(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::NotFound, message))
}

/// A request that the record's state does not allow (a rollback to a
/// failed deployment, a cancel of a finished one).
fn failed_precondition(message: impl Into<String>) -> MutationResult {
    Err(WireError::new(ErrorCode::FailedPrecondition, message))
}
