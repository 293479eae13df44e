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

/// `ctrl sentinel apply` as a patch, merged at apply over the stored
/// sentinel.
mod patch {
    use wire::ErrorCode;
    use wire::model::{DesiredState, SentinelDeployStatus};
    use wire::rules::deploy::sentinel_id;
    use wire::rules::sentinel::{SENTINEL_REPLICAS_DEFAULT, SentinelPatch};

    use crate::test_support::*;
    use crate::{Mutation, MutationResult, Outcome, Store, mutations};

    const DEADLINE_MS: u64 = 600_000;

    /// A patch of `env`'s sentinel in `eu` that sets nothing.
    fn nothing() -> SentinelPatch {
        SentinelPatch {
            workspace_id: "ws".into(),
            project_id: "proj".into(),
            app_id: "app".into(),
            environment_id: "env".into(),
            region: "eu".into(),
            image: None,
            replicas: None,
            cpu_millicores: None,
            memory_mib: None,
        }
    }

    /// What a node proposes for `patch`, having read `_base` (the
    /// sentinel as it saw it): the patch alone, nothing of `_base`.
    fn proposal(_base: &wire::model::Sentinel, patch: SentinelPatch) -> Mutation {
        Mutation::PatchSentinel(mutations::PatchSentinel {
            patch,
            deadline_ms: DEADLINE_MS,
        })
    }

    fn apply(store: &Store, now: u64, mutation: Mutation) -> MutationResult {
        apply_one(store, now, vec![mutation]).remove(0)
    }

    fn row(store: &Store) -> wire::model::Sentinel {
        store
            .read()
            .unwrap()
            .sentinel(&sentinel_id("env", "eu"), "eu")
            .unwrap()
            .unwrap()
    }

    fn create(store: &Store) -> wire::model::Sentinel {
        let first = SentinelPatch {
            image: Some("img:1".into()),
            replicas: Some(2),
            ..nothing()
        };
        let created = apply(
            store,
            100,
            Mutation::PatchSentinel(mutations::PatchSentinel {
                patch: first,
                deadline_ms: DEADLINE_MS,
            }),
        );
        assert!(
            matches!(
                created,
                Ok(Outcome::SentinelDeployed {
                    status: SentinelDeployStatus::Progressing,
                    ..
                })
            ),
            "{created:?}"
        );
        row(store)
    }

    /// The pinned regression (issue 32, item 4): two applies made against
    /// the same version, each setting another field, both land.
    #[test]
    fn two_patches_made_against_the_same_record_keep_both_fields() {
        let store = store();
        let base = create(&store);
        // Both made while the stored sentinel was `base`...
        let image = proposal(
            &base,
            SentinelPatch {
                image: Some("img:2".into()),
                ..nothing()
            },
        );
        let replicas = proposal(
            &base,
            SentinelPatch {
                replicas: Some(5),
                ..nothing()
            },
        );
        // ...and applied one after the other.
        assert!(apply(&store, 101, image).is_ok());
        assert!(apply(&store, 102, replicas).is_ok());
        let stored = row(&store);
        assert_eq!(
            (stored.image.as_str(), stored.replicas),
            ("img:2", 5),
            "both changes kept"
        );
        assert_eq!(stored.version, base.version + 2, "one version each");
        assert_eq!(stored.deploy.status, SentinelDeployStatus::Progressing);
    }

    #[test]
    fn a_new_sentinel_takes_the_defaults_and_needs_an_image() {
        let store = store();
        let before = store.read().unwrap().state_hash().unwrap();
        let no_image = apply(
            &store,
            100,
            Mutation::PatchSentinel(mutations::PatchSentinel {
                patch: nothing(),
                deadline_ms: DEADLINE_MS,
            }),
        )
        .unwrap_err();
        assert_eq!(no_image.code, ErrorCode::BadRequest, "{no_image}");
        assert_eq!(store.read().unwrap().state_hash().unwrap(), before);
        let created = apply(
            &store,
            101,
            Mutation::PatchSentinel(mutations::PatchSentinel {
                patch: SentinelPatch {
                    image: Some("img:1".into()),
                    ..nothing()
                },
                deadline_ms: DEADLINE_MS,
            }),
        );
        assert_eq!(
            created,
            Ok(Outcome::SentinelDeployed {
                sentinel_id: sentinel_id("env", "eu"),
                version: 1,
                status: SentinelDeployStatus::Progressing,
            })
        );
        let s = row(&store);
        assert_eq!(s.replicas, SENTINEL_REPLICAS_DEFAULT);
        assert_eq!(
            (s.deploy.started_at_ms, s.deploy.deadline_at_ms),
            (101, 101 + DEADLINE_MS)
        );
    }

    /// A sentinel of another id (an older apply's) is the environment's
    /// all the same: merged over, not doubled; a stopped one runs again.
    #[test]
    fn the_environments_sentinel_of_another_id_is_patched() {
        let store = store();
        let mut old = sentinel("snt_old", "eu");
        old.desired_state = DesiredState::Stopped;
        assert_eq!(
            apply(&store, 100, Mutation::UpsertSentinel(old)),
            Ok(Outcome::Recorded)
        );
        let patched = apply(
            &store,
            101,
            Mutation::PatchSentinel(mutations::PatchSentinel {
                patch: SentinelPatch {
                    replicas: Some(4),
                    ..nothing()
                },
                deadline_ms: DEADLINE_MS,
            }),
        );
        assert!(
            matches!(&patched, Ok(Outcome::SentinelDeployed { sentinel_id, version: 2, .. })
                if sentinel_id == "snt_old"),
            "{patched:?}"
        );
        let view = store.read().unwrap();
        let region = view.region_sentinels("eu", 10).unwrap();
        assert_eq!(region.len(), 1, "{region:?}");
        assert_eq!(region[0].replicas, 4);
        assert_eq!(region[0].image, "registry.local/sentinel:1", "kept");
        assert_eq!(region[0].desired_state, DesiredState::Running);
    }

    /// Under a request id the answer is recorded as apply made it: a retry
    /// after another change answers the first version, writing nothing.
    #[test]
    fn a_retried_request_answers_what_its_first_apply_made() {
        let store = store();
        create(&store);
        let request = |id: &str, fingerprint: u8, patch: SentinelPatch| {
            Mutation::Request(mutations::Request {
                request_id: id.into(),
                fingerprint: [fingerprint; 32],
                actor: "operator".into(),
                mutation: Box::new(Mutation::PatchSentinel(mutations::PatchSentinel {
                    patch,
                    deadline_ms: DEADLINE_MS,
                })),
            })
        };
        let replicas = SentinelPatch {
            replicas: Some(5),
            ..nothing()
        };
        let first = apply(&store, 101, request("r1", 1, replicas.clone())).unwrap();
        let image = SentinelPatch {
            image: Some("img:2".into()),
            ..nothing()
        };
        apply(&store, 102, request("r2", 2, image)).unwrap();
        let before = store.read().unwrap().state_hash().unwrap();
        let again = apply(&store, 103, request("r1", 1, replicas)).unwrap();
        assert_eq!(again, first);
        assert_eq!(store.read().unwrap().state_hash().unwrap(), before);
    }

    /// An entry of the older mutation, a sentinel merged by its proposer,
    /// still applies as it did: written whole.
    #[test]
    fn an_older_nodes_merged_deploy_applies_as_it_did() {
        let store = store();
        let base = create(&store);
        let merged = wire::rules::sentinel::merge(
            Some(base.clone()),
            &SentinelPatch {
                memory_mib: Some(256),
                ..nothing()
            },
        )
        .unwrap();
        let out = apply(
            &store,
            101,
            Mutation::DeploySentinel(mutations::DeploySentinel {
                sentinel: merged,
                deadline_ms: DEADLINE_MS,
            }),
        );
        assert!(
            matches!(out, Ok(Outcome::SentinelDeployed { version: 2, .. })),
            "{out:?}"
        );
        let stored = row(&store);
        assert_eq!((stored.memory_mib, stored.replicas), (256, base.replicas));
    }
}

/// The sentinels' index by environment: found by key whatever the id,
/// the lowest id when several name one environment, and kept right when a
/// sentinel stops naming one.
mod by_environment {
    use crate::test_support::*;
    use crate::{Mutation, Store};

    fn upsert(store: &Store, id: &str, environment: &str) {
        let mut s = sentinel(id, "eu");
        s.environment_id = environment.into();
        apply_one(store, 5, vec![Mutation::UpsertSentinel(s)]);
    }

    /// The id of `environment`'s sentinel in `eu`, looked up with a likely
    /// id no sentinel has.
    fn found(store: &Store, environment: &str) -> Option<String> {
        let view = store.read().unwrap();
        view.environment_sentinel(environment, "eu", "snt_unlikely")
            .unwrap()
            .map(|s| s.id)
    }

    #[test]
    fn a_sentinel_is_found_by_its_environment_whatever_its_id() {
        let store = store();
        upsert(&store, "s9", "env-a");
        upsert(&store, "s5", "env-b");
        assert_eq!(found(&store, "env-a").as_deref(), Some("s9"));
        assert_eq!(found(&store, "env-b").as_deref(), Some("s5"));
        assert_eq!(found(&store, "env-c"), None);
        // A second sentinel of one environment: the lowest id, as a scan
        // in id order found it.
        upsert(&store, "s1", "env-a");
        upsert(&store, "s10", "env-a");
        assert_eq!(found(&store, "env-a").as_deref(), Some("s1"));
    }

    #[test]
    fn a_sentinel_that_moves_to_another_environment_leaves_the_index_right() {
        let store = store();
        upsert(&store, "s1", "env-a");
        upsert(&store, "s2", "env-a");
        upsert(&store, "s1", "env-b");
        assert_eq!(found(&store, "env-a").as_deref(), Some("s2"));
        assert_eq!(found(&store, "env-b").as_deref(), Some("s1"));
        upsert(&store, "s2", "env-b");
        assert_eq!(found(&store, "env-a"), None);
        assert_eq!(found(&store, "env-b").as_deref(), Some("s1"));
        // Rebuilt the same way by a snapshot's import.
        let (snapshot, _) = store.export_snapshot().unwrap();
        let copy = Store::in_memory().unwrap();
        copy.import_snapshot(&snapshot).unwrap();
        assert_eq!(found(&copy, "env-a"), None);
        assert_eq!(found(&copy, "env-b").as_deref(), Some("s1"));
    }
}
