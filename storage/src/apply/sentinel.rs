//! Sentinels: the per-environment, per-region proxy. An upsert creates or
//! replaces the row with a new version (a pk) and a change row, keeping the
//! first `created_at_ms`; a status report records what krane observed and
//! writes no change row.
//!
//! A sentinel *deploy* (`Mutation::PatchSentinel`, the older
//! `Mutation::DeploySentinel`, and a rollout's writes) is tracked on the row (`Sentinel::deploy`): written
//! `progressing` with an absolute deadline, it becomes `ready` in the
//! apply of the first status report that shows it converged
//! ([`wire::model::sentinel_converged`]) before its deadline — the wait
//! is a condition re-checked at every report's apply, so no report is
//! missed whenever it lands — or, by the driver's guarded
//! [`SentinelTransition`], `ready` (the same check) or `failed` once the
//! entry's time is past the deadline. The guard is (deploy status,
//! version), see [`wire::rules::sentinel`]: a failure decided before a
//! report made it ready, or before a newer version, changes nothing.
//!
//! `ctrl sentinel apply` proposes a patch (`Mutation::PatchSentinel`),
//! merged here over the environment's sentinel as this apply reads it
//! ([`wire::rules::sentinel::merge`]): applies that race are merged one
//! after the other, each over what the previous one wrote, so neither
//! loses the other's fields. `Mutation::DeploySentinel`, a sentinel
//! merged by the proposer, is applied as it was, for entries older nodes
//! wrote.

use wire::model::{
    DesiredState, Pk, ResourceType, Sentinel, SentinelDeploy, SentinelDeployStatus, SentinelStatus,
    sentinel_converged,
};
use wire::rules::deploy::sentinel_id;
use wire::rules::sentinel::{SentinelPatch, merge, same_spec, sentinel_guard};

use super::{Applier, OP, bad_request, failed_precondition, guard_refusal, not_found};
use crate::command::{MutationResult, Outcome, SentinelAction, SentinelTransition, Touched};
use crate::error::{RedbContext, Result};
use crate::read::{find_environment_sentinel, index_environment_sentinel};
use crate::tables::{decode, encode, load, name};
use redb::ReadableTable;

impl Applier<'_> {
    pub(super) fn upsert_sentinel(&mut self, sentinel: &Sentinel) -> Result<MutationResult> {
        if sentinel.id.is_empty() || sentinel.region.is_empty() {
            return Ok(bad_request("a sentinel needs an id and a region"));
        }
        // A plain upsert (a deploy's creation, a stop) is not a tracked
        // deploy.
        self.write_sentinel_version(sentinel, SentinelDeploy::default())?;
        Ok(Ok(Outcome::Recorded))
    }

    /// Writes `sentinel` as a new version (a pk and a change row) with
    /// `deploy` as its deploy record, keeping the first `created_at_ms`;
    /// the new version.
    fn write_sentinel_version(
        &mut self,
        sentinel: &Sentinel,
        deploy: SentinelDeploy,
    ) -> Result<Pk> {
        let key = (sentinel.region.as_str(), sentinel.id.as_str());
        let existing: Option<Sentinel> = load(&self.t.sentinels, name::SENTINELS, key)?;
        let mut row = sentinel.clone();
        row.version = self.record_change(ResourceType::Sentinel, &sentinel.id, &sentinel.region)?;
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        row.deploy = deploy;
        self.put_sentinel(&row)?;
        Ok(row.version)
    }

    /// Writes a sentinel row as it is (no new version, no change row), and
    /// its environment's index row. A sentinel that stops naming an
    /// environment (an upsert of its id for another one: not something a
    /// deploy or an apply does) takes that environment's row back, and the
    /// region is scanned for the environment's next sentinel: the one
    /// write here whose cost grows with the region.
    fn put_sentinel(&mut self, row: &Sentinel) -> Result<()> {
        let key = (row.region.as_str(), row.id.as_str());
        let moved = load::<_, Sentinel>(&self.t.sentinels, name::SENTINELS, key)?
            .filter(|was| was.environment_id != row.environment_id);
        let bytes = encode("a sentinel", row)?;
        self.t
            .sentinels
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINELS)?;
        index_environment_sentinel(&mut self.t.environment_sentinels, row, OP)?;
        self.touch(Touched::Sentinel {
            region: row.region.clone(),
            id: row.id.clone(),
        });
        if let Some(was) = moved {
            self.reindex_environment_sentinels(&was.region, &was.environment_id, &was.id)?;
        }
        Ok(())
    }

    /// Points the index row of `environment_id` in `region`, if it names
    /// `left_id` (a sentinel that no longer names the environment), at the
    /// environment's sentinel with the lowest id, or removes it.
    fn reindex_environment_sentinels(
        &mut self,
        region: &str,
        environment_id: &str,
        left_id: &str,
    ) -> Result<()> {
        let named = self
            .t
            .environment_sentinels
            .get((region, environment_id))
            .ctx_table(OP, name::ENVIRONMENT_SENTINELS)?
            .map(|id| id.value() == left_id);
        if named != Some(true) {
            return Ok(());
        }
        self.t
            .environment_sentinels
            .remove((region, environment_id))
            .ctx_table(OP, name::ENVIRONMENT_SENTINELS)?;
        let mut next = None;
        for entry in self
            .t
            .sentinels
            .range::<(&str, &str)>((region, "")..)
            .ctx_table(OP, name::SENTINELS)?
        {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            if key.value().0 != region {
                break;
            }
            let sentinel: Sentinel = decode(name::SENTINELS, &key.value(), value.value())?;
            if sentinel.environment_id == environment_id {
                next = Some(sentinel);
                break;
            }
        }
        if let Some(sentinel) = next {
            index_environment_sentinel(&mut self.t.environment_sentinels, &sentinel, OP)?;
        }
        Ok(())
    }

    /// Writes `sentinel` as a new version whose deploy is progressing
    /// until `deadline_ms` from now; the new version.
    pub(super) fn start_sentinel_deploy(
        &mut self,
        sentinel: &Sentinel,
        deadline_ms: u64,
    ) -> Result<Pk> {
        let deploy = SentinelDeploy {
            status: SentinelDeployStatus::Progressing,
            started_at_ms: self.now_ms,
            deadline_at_ms: self.now_ms.saturating_add(deadline_ms),
            ended_at_ms: None,
            reason: None,
        };
        self.write_sentinel_version(sentinel, deploy)
    }

    /// The stored sentinel `id` of `region` and its last status.
    pub(super) fn sentinel_and_status(
        &self,
        id: &str,
        region: &str,
    ) -> Result<(Option<Sentinel>, Option<SentinelStatus>)> {
        let sentinel = load(&self.t.sentinels, name::SENTINELS, (region, id))?;
        let status = load(&self.t.sentinel_status, name::SENTINEL_STATUS, (region, id))?;
        Ok((sentinel, status))
    }

    pub(super) fn deploy_sentinel(
        &mut self,
        sentinel: &Sentinel,
        deadline_ms: u64,
    ) -> Result<MutationResult> {
        if sentinel.id.is_empty() || sentinel.region.is_empty() || sentinel.image.is_empty() {
            return Ok(bad_request("a sentinel needs an id, a region and an image"));
        }
        if deadline_ms == 0 {
            return Ok(bad_request("a sentinel deploy needs a deadline"));
        }
        let (existing, status) = self.sentinel_and_status(&sentinel.id, &sentinel.region)?;
        if let Some(existing) = &existing
            && same_spec(existing, sentinel)
        {
            let converged = status
                .as_ref()
                .is_some_and(|s| sentinel_converged(existing, s));
            let answer = |status| {
                Ok(Ok(Outcome::SentinelDeployed {
                    sentinel_id: existing.id.clone(),
                    version: existing.version,
                    status,
                }))
            };
            if converged {
                return answer(SentinelDeployStatus::Ready);
            }
            if existing.deploy.status == SentinelDeployStatus::Progressing {
                return answer(SentinelDeployStatus::Progressing);
            }
        }
        let version = self.start_sentinel_deploy(sentinel, deadline_ms)?;
        Ok(Ok(Outcome::SentinelDeployed {
            sentinel_id: sentinel.id.clone(),
            version,
            status: SentinelDeployStatus::Progressing,
        }))
    }

    /// `patch` merged over the environment's sentinel in its region as
    /// stored now (found by key, see
    /// [`find_environment_sentinel`]), or over the defaults, then deployed
    /// as [`Applier::deploy_sentinel`] deploys it.
    pub(super) fn patch_sentinel(
        &mut self,
        patch: &SentinelPatch,
        deadline_ms: u64,
    ) -> Result<MutationResult> {
        let likely_id = sentinel_id(&patch.environment_id, &patch.region);
        let existing = find_environment_sentinel(
            &self.t.sentinels,
            &self.t.environment_sentinels,
            &patch.environment_id,
            &patch.region,
            &likely_id,
        )?;
        match merge(existing, patch) {
            Ok(sentinel) => self.deploy_sentinel(&sentinel, deadline_ms),
            Err(refused) => Ok(Err(refused)),
        }
    }

    pub(super) fn sentinel_transition(
        &mut self,
        transition: &SentinelTransition,
    ) -> Result<MutationResult> {
        let (found, status) =
            self.sentinel_and_status(&transition.sentinel_id, &transition.region)?;
        let guard = found.as_ref().map(sentinel_guard);
        if let Some(refusal) = guard_refusal(&transition.expected, guard) {
            return Ok(Ok(refusal));
        }
        let Some(mut sentinel) = found else {
            return Ok(not_found(format!(
                "no sentinel {:?} in region {:?}",
                transition.sentinel_id, transition.region
            )));
        };
        if sentinel.deploy.status != SentinelDeployStatus::Progressing {
            return Ok(failed_precondition(format!(
                "the deploy of sentinel {:?} is {}, not progressing",
                sentinel.id,
                sentinel.deploy.status.as_str()
            )));
        }
        match &transition.action {
            SentinelAction::Ready => {
                if !status.is_some_and(|s| sentinel_converged(&sentinel, &s))
                    || self.now_ms >= sentinel.deploy.deadline_at_ms
                {
                    return Ok(failed_precondition(format!(
                        "sentinel {:?} has not converged before its deadline",
                        sentinel.id
                    )));
                }
                sentinel.deploy.status = SentinelDeployStatus::Ready;
            }
            SentinelAction::Fail { reason } => {
                if self.now_ms < sentinel.deploy.deadline_at_ms {
                    return Ok(failed_precondition(format!(
                        "the deadline of sentinel {:?} has not passed",
                        sentinel.id
                    )));
                }
                sentinel.deploy.status = SentinelDeployStatus::Failed;
                sentinel.deploy.reason = Some(reason.clone());
            }
        }
        sentinel.deploy.ended_at_ms = Some(self.now_ms);
        self.put_sentinel(&sentinel)?;
        Ok(Ok(Outcome::Recorded))
    }

    /// Kubernetes rejected `version` of sentinel `id`: a deploy of that
    /// version in progress fails with the reason (a rejection is final for
    /// the version; no deadline to wait for).
    pub(super) fn sentinel_rejected(
        &mut self,
        id: &str,
        region: &str,
        version: Pk,
        reason: String,
    ) -> Result<()> {
        let (found, _) = self.sentinel_and_status(id, region)?;
        if let Some(mut sentinel) = found
            && sentinel.version == version
            && sentinel.deploy.status == SentinelDeployStatus::Progressing
        {
            sentinel.deploy.status = SentinelDeployStatus::Failed;
            sentinel.deploy.reason = Some(reason);
            sentinel.deploy.ended_at_ms = Some(self.now_ms);
            self.put_sentinel(&sentinel)?;
        }
        Ok(())
    }

    pub(super) fn report_sentinel_status(
        &mut self,
        status: &SentinelStatus,
    ) -> Result<MutationResult> {
        let key = (status.region.as_str(), status.sentinel_id.as_str());
        let existing: Option<Sentinel> = load(&self.t.sentinels, name::SENTINELS, key)?;
        let Some(mut sentinel) = existing else {
            return Ok(not_found(format!(
                "no sentinel {:?} in region {:?}",
                status.sentinel_id, status.region
            )));
        };
        let bytes = encode("a sentinel status", status)?;
        self.t
            .sentinel_status
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINEL_STATUS)?;
        self.touch(Touched::Sentinel {
            region: status.region.clone(),
            id: status.sentinel_id.clone(),
        });
        // The wait of a deploy in flight, re-checked with every report:
        // converged before the deadline is ready, in this same apply.
        if sentinel.deploy.status == SentinelDeployStatus::Progressing
            && self.now_ms < sentinel.deploy.deadline_at_ms
            && sentinel.desired_state == DesiredState::Running
            && sentinel_converged(&sentinel, status)
        {
            sentinel.deploy.status = SentinelDeployStatus::Ready;
            sentinel.deploy.ended_at_ms = Some(self.now_ms);
            self.put_sentinel(&sentinel)?;
        }
        Ok(Ok(Outcome::Recorded))
    }
}

#[cfg(test)]
mod tests;
