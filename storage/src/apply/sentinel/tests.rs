//! Tests of `storage/src/apply/sentinel`.
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
            vec![Mutation::DeploySentinel(crate::mutations::DeploySentinel {
                sentinel: s,
                deadline_ms: DEADLINE_MS,
            })],
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
