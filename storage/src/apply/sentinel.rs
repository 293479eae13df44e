//! Sentinels: the per-environment, per-region proxy. An upsert creates or
//! replaces the row with a new version (a pk) and a change row, keeping the
//! first `created_at_ms`; a status report records what krane observed and
//! writes no change row.
//!
//! A sentinel *deploy* (`Mutation::DeploySentinel`, and a rollout's
//! writes) is tracked on the row (`Sentinel::deploy`): written
//! `progressing` with an absolute deadline, it becomes `ready` in the
//! apply of the first status report that shows it converged
//! ([`wire::model::sentinel_converged`]) before its deadline — the wait
//! is a condition re-checked at every report's apply, so no report is
//! missed whenever it lands — or, by the driver's guarded
//! [`SentinelTransition`], `ready` (the same check) or `failed` once the
//! entry's time is past the deadline. The guard is (deploy status,
//! version), see [`wire::rules::sentinel`]: a failure decided before a
//! report made it ready, or before a newer version, changes nothing.

use wire::model::{
    DesiredState, Pk, ResourceType, Sentinel, SentinelDeploy, SentinelDeployStatus, SentinelStatus,
    sentinel_converged,
};
use wire::rules::sentinel::{same_spec, sentinel_guard};

use super::{Applier, OP, bad_request, failed_precondition, guard_refusal, not_found};
use crate::command::{MutationResult, Outcome, SentinelAction, SentinelTransition};
use crate::error::{RedbContext, Result};
use crate::tables::{encode, load, name};

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

    /// Writes a sentinel row as it is (no new version, no change row).
    fn put_sentinel(&mut self, row: &Sentinel) -> Result<()> {
        let bytes = encode("a sentinel", row)?;
        self.t
            .sentinels
            .insert((row.region.as_str(), row.id.as_str()), bytes.as_slice())
            .ctx_table(OP, name::SENTINELS)?;
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
mod tests {
    use crate::test_support::*;
    use crate::{Mutation, Outcome};

    #[test]
    fn sentinels_get_versions_and_keep_created_at() {
        let store = store();
        apply_one(
            &store,
            7,
            vec![Mutation::UpsertSentinel(sentinel("s1", "eu"))],
        );
        apply_one(
            &store,
            9,
            vec![Mutation::UpsertSentinel(sentinel("s1", "eu"))],
        );
        let out = apply_one(
            &store,
            10,
            vec![Mutation::ReportSentinelStatus(sentinel_status("s1", "eu"))],
        );
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let view = store.read().unwrap();
        let s = view.sentinel("s1", "eu").unwrap().unwrap();
        assert_eq!((s.version, s.created_at_ms, s.updated_at_ms), (2, 7, 9));
        assert_eq!(view.last_pk(), 2);
        assert!(view.sentinel_status("s1", "eu").unwrap().is_some());
    }

    mod deploy {
        use wire::model::{SentinelDeployStatus, SentinelStatus};
        use wire::rules::sentinel::sentinel_guard;
        use wire::{ErrorCode, WireError};

        use crate::command::{SentinelAction, SentinelTransition};
        use crate::test_support::*;
        use crate::{Mutation, Outcome, Store};

        const DEADLINE_MS: u64 = 600_000;

        fn deploy(store: &Store, now: u64, image: &str) -> Outcome {
            let mut s = sentinel("s1", "eu");
            s.image = image.into();
            let out = apply_one(
                store,
                now,
                vec![Mutation::DeploySentinel {
                    sentinel: s,
                    deadline_ms: DEADLINE_MS,
                }],
            );
            out.into_iter().next().unwrap().unwrap()
        }

        /// What krane reports once it applied `version` with `image`.
        fn converged(version: u64, image: &str) -> SentinelStatus {
            SentinelStatus {
                running_image: image.into(),
                applied_version: version,
                ..sentinel_status("s1", "eu")
            }
        }

        fn report(store: &Store, now: u64, status: SentinelStatus) {
            let out = apply_one(store, now, vec![Mutation::ReportSentinelStatus(status)]);
            assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        }

        fn fail(store: &Store, now: u64, guard: crate::Guard) -> crate::MutationResult {
            let t = SentinelTransition {
                sentinel_id: "s1".into(),
                region: "eu".into(),
                expected: guard,
                action: SentinelAction::Fail {
                    reason: "deadline".into(),
                },
            };
            apply_one(store, now, vec![Mutation::Sentinel(t)]).remove(0)
        }

        fn row(store: &Store) -> wire::model::Sentinel {
            store.read().unwrap().sentinel("s1", "eu").unwrap().unwrap()
        }

        #[test]
        fn a_change_is_written_progressing_with_an_absolute_deadline() {
            let store = store();
            let out = deploy(&store, 100, "img:1");
            assert_eq!(
                out,
                Outcome::SentinelDeployed {
                    sentinel_id: "s1".into(),
                    version: 1,
                    status: SentinelDeployStatus::Progressing
                }
            );
            let s = row(&store);
            assert_eq!(s.deploy.status, SentinelDeployStatus::Progressing);
            assert_eq!(
                (s.deploy.started_at_ms, s.deploy.deadline_at_ms),
                (100, 100 + DEADLINE_MS)
            );
        }

        /// The pinned regression: a report applied right after the write
        /// (no driver round in between) makes the deploy ready.
        #[test]
        fn a_report_applied_right_after_the_write_is_not_lost() {
            let store = store();
            deploy(&store, 100, "img:1");
            report(&store, 101, converged(1, "img:1"));
            let s = row(&store);
            assert_eq!(s.deploy.status, SentinelDeployStatus::Ready);
            assert_eq!(s.deploy.ended_at_ms, Some(101));
        }

        /// The pinned regression: a deadline decided before (or after) the
        /// report made it ready changes nothing.
        #[test]
        fn a_deadline_after_ready_changes_nothing() {
            let store = store();
            deploy(&store, 100, "img:1");
            let decided_on = sentinel_guard(&row(&store));
            report(&store, 101, converged(1, "img:1"));
            let before = store.read().unwrap().state_hash().unwrap();
            let late = fail(&store, 100 + DEADLINE_MS + 1, decided_on);
            assert!(matches!(late, Ok(Outcome::GuardFailed { .. })), "{late:?}");
            assert_eq!(row(&store).deploy.status, SentinelDeployStatus::Ready);
            assert_eq!(store.read().unwrap().state_hash().unwrap(), before);
        }

        #[test]
        fn a_report_of_an_older_version_or_image_does_not_make_it_ready() {
            let store = store();
            deploy(&store, 100, "img:1");
            report(&store, 101, converged(1, "img:1"));
            deploy(&store, 200, "img:2");
            // krane still reports the spec of version 1.
            report(&store, 201, converged(1, "img:1"));
            // The new spec applied but not yet rolled: old image running.
            report(&store, 202, converged(2, "img:1"));
            assert_eq!(row(&store).deploy.status, SentinelDeployStatus::Progressing);
            report(&store, 203, converged(2, "img:2"));
            assert_eq!(row(&store).deploy.status, SentinelDeployStatus::Ready);
        }

        #[test]
        fn the_deadline_fails_it_only_once_passed_and_a_late_report_changes_nothing() {
            let store = store();
            deploy(&store, 100, "img:1");
            let guard = sentinel_guard(&row(&store));
            let early = fail(&store, 100 + DEADLINE_MS - 1, guard.clone());
            assert!(
                matches!(
                    &early,
                    Err(WireError {
                        code: ErrorCode::FailedPrecondition,
                        ..
                    })
                ),
                "{early:?}"
            );
            assert_eq!(
                fail(&store, 100 + DEADLINE_MS, guard),
                Ok(Outcome::Recorded)
            );
            assert_eq!(row(&store).deploy.status, SentinelDeployStatus::Failed);
            report(&store, 100 + DEADLINE_MS + 1, converged(1, "img:1"));
            assert_eq!(row(&store).deploy.status, SentinelDeployStatus::Failed);
        }

        #[test]
        fn nothing_changed_and_converged_writes_nothing_and_answers_ready() {
            let store = store();
            deploy(&store, 100, "img:1");
            report(&store, 101, converged(1, "img:1"));
            let before = store.read().unwrap().state_hash().unwrap();
            let again = deploy(&store, 102, "img:1");
            assert_eq!(
                again,
                Outcome::SentinelDeployed {
                    sentinel_id: "s1".into(),
                    version: 1,
                    status: SentinelDeployStatus::Ready
                }
            );
            assert_eq!(store.read().unwrap().state_hash().unwrap(), before);
            // The same change in flight: joined, not written again.
            deploy(&store, 103, "img:2");
            let hash = store.read().unwrap().state_hash().unwrap();
            let joined = deploy(&store, 104, "img:2");
            assert!(matches!(
                joined,
                Outcome::SentinelDeployed {
                    version: 2,
                    status: SentinelDeployStatus::Progressing,
                    ..
                }
            ));
            assert_eq!(store.read().unwrap().state_hash().unwrap(), hash);
        }
    }
}
