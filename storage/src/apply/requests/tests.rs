//! Tests of `storage/src/apply/requests`.
use wire::ErrorCode;
use wire::model::DesiredState;

use crate::command::{Fingerprint, Mutation, MutationResult, Outcome};
use crate::test_support::*;
use crate::{ReadView, Store};

const A: Fingerprint = [0xaa; 32];
const B: Fingerprint = [0xbb; 32];

fn request(id: &str, fingerprint: Fingerprint, mutation: Mutation) -> Mutation {
    Mutation::Request(crate::mutations::Request {
        request_id: id.to_string(),
        fingerprint,
        actor: "operator".into(),
        mutation: Box::new(mutation),
    })
}

/// Everything apply writes but the Raft metadata: the state hash, the
/// pk counters and the request records.
fn state(store: &Store) -> (u64, u64, u64, u64) {
    let view: ReadView = store.read().unwrap();
    (
        view.state_hash().unwrap(),
        view.last_pk(),
        view.floor_pk(),
        view.request_count().unwrap(),
    )
}

fn code(result: &MutationResult) -> Option<ErrorCode> {
    result.as_ref().err().map(|e| e.code)
}

#[test]
fn a_replay_returns_the_first_answer_and_writes_nothing() {
    let store = store();
    let first = apply_one(&store, 10, vec![request("r1", A, submit("d1", &["eu"], 1))]);
    assert_eq!(
        first,
        vec![Ok(Outcome::DeploymentCreated {
            deployment_id: "d1".into()
        })]
    );
    let record = store.read().unwrap().request("r1").unwrap().expect("kept");
    assert_eq!(
        (record.fingerprint, &record.result, record.created_at_ms),
        (A, &first[0], 10)
    );
    assert_eq!(record.actor, "operator");
    let before = state(&store);

    // A retry proposes the same request again, with a new id minted by
    // whichever node received it: the first answer, nothing written.
    let again = apply_one(&store, 20, vec![request("r1", A, submit("d2", &["eu"], 1))]);
    assert_eq!(again, first);
    assert_eq!(state(&store), before);
    assert!(store.read().unwrap().deployment("d2").unwrap().is_none());
}

#[test]
fn another_request_under_a_used_id_is_refused_and_writes_nothing() {
    let store = store();
    apply_one(&store, 10, vec![request("r1", A, submit("d1", &["eu"], 1))]);
    let before = state(&store);
    let out = apply_one(&store, 20, vec![request("r1", B, submit("d2", &["eu"], 1))]);
    assert_eq!(code(&out[0]), Some(ErrorCode::Conflict));
    let message = &out[0].as_ref().unwrap_err().message;
    assert!(
        message.contains("r1") && message.contains("another request"),
        "{message}"
    );
    assert_eq!(state(&store), before);
}

#[test]
fn an_error_answer_is_recorded_and_replayed() {
    let store = store();
    let stop = || set_state("d1", DesiredState::Standby);
    let first = apply_one(&store, 10, vec![request("r1", A, stop())]);
    assert_eq!(code(&first[0]), Some(ErrorCode::NotFound));
    assert_eq!(state(&store).3, 1, "the refusal is recorded");
    // The deployment exists now, but the request's answer stays.
    apply_one(&store, 11, vec![submit("d1", &["eu"], 1)]);
    let before = state(&store);
    let again = apply_one(&store, 12, vec![request("r1", A, stop())]);
    assert_eq!(again, first);
    assert_eq!(state(&store), before);
}

#[test]
fn a_bad_request_wrapper_is_refused_and_writes_nothing() {
    // The same setup, without the refused requests.
    let store_before = store();
    let store = store();
    let inner = || submit("d1", &["eu"], 1);
    let mut empty_actor = request("r1", A, inner());
    if let Mutation::Request(crate::mutations::Request { actor, .. }) = &mut empty_actor {
        actor.clear();
    }
    let out = apply_one(
        &store,
        10,
        vec![
            request("", A, inner()),
            request("a b", A, inner()),
            request(
                &"x".repeat(wire::operator::REQUEST_ID_BYTES_MAX + 1),
                A,
                inner(),
            ),
            empty_actor,
            request("r1", A, request("r2", A, inner())),
        ],
    );
    assert!(
        out.iter().all(|r| code(r) == Some(ErrorCode::BadRequest)),
        "{out:?}"
    );
    assert_eq!(state(&store), state(&store_before));
}

#[test]
fn compaction_deletes_the_records_past_the_retention_oldest_first() {
    let store = store();
    for (i, now) in [10u64, 20, 30, 40].into_iter().enumerate() {
        let id = format!("r{i}");
        apply_one(&store, now, vec![request(&id, A, submit(&id, &["eu"], 1))]);
    }
    let compact = |requests_created_before_ms, rows_max| {
        Mutation::Compact(crate::mutations::Compact {
            created_before_ms: 0,
            rows_max,
            requests_created_before_ms,
            keep_rows_min: 0,
        })
    };
    // Older than 35: three records, at most two per step.
    let out = apply_one(&store, 50, vec![compact(35, 2)]);
    assert!(
        matches!(
            out[0],
            Ok(Outcome::Compacted {
                requests_deleted: 2,
                ..
            })
        ),
        "{out:?}"
    );
    let out = apply_one(&store, 51, vec![compact(35, 2)]);
    assert!(
        matches!(
            out[0],
            Ok(Outcome::Compacted {
                requests_deleted: 1,
                ..
            })
        ),
        "{out:?}"
    );
    let view = store.read().unwrap();
    assert_eq!(view.request_count().unwrap(), 1);
    assert!(view.request("r2").unwrap().is_none());
    assert!(view.request("r3").unwrap().is_some());
    drop(view);
    // The deployments the requests made stay; an expired id is new again.
    let out = apply_one(&store, 60, vec![request("r0", B, submit("d9", &["eu"], 1))]);
    assert_eq!(
        out,
        vec![Ok(Outcome::DeploymentCreated {
            deployment_id: "d9".into()
        })]
    );
}

#[test]
fn a_full_table_evicts_the_oldest_record() {
    let store = store().with_requests_max(3);
    // Two at the same time: the id breaks the tie.
    for (id, now) in [
        ("rb", 10u64),
        ("ra", 10),
        ("rc", 20),
        ("rd", 30),
        ("re", 40),
    ] {
        apply_one(&store, now, vec![request(id, A, submit(id, &["eu"], 1))]);
    }
    let view = store.read().unwrap();
    assert_eq!(view.request_count().unwrap(), 3);
    let kept: Vec<bool> = ["ra", "rb", "rc", "rd", "re"]
        .iter()
        .map(|id| view.request(id).unwrap().is_some())
        .collect();
    assert_eq!(kept, [false, false, true, true, true]);
    // Evicted within the transaction that stores the new record, with
    // its index row: a snapshot (which checks the index) still exports.
    drop(view);
    store.export_snapshot().unwrap();
}

#[test]
fn a_snapshot_keeps_the_records_and_replays_from_them() {
    let source = store();
    let first = apply_one(
        &source,
        10,
        vec![
            request("r1", A, submit("d1", &["eu"], 1)),
            request("r2", B, submit("d1", &["eu"], 1)),
        ],
    );
    assert_eq!(
        code(&first[1]),
        Some(ErrorCode::BadRequest),
        "a duplicate id"
    );
    let (bytes, _) = source.export_snapshot().unwrap();
    let target = store();
    target.import_snapshot(&bytes).unwrap();
    assert_eq!(state(&target), state(&source));
    for id in ["r1", "r2"] {
        assert_eq!(
            target.read().unwrap().request(id).unwrap(),
            source.read().unwrap().request(id).unwrap()
        );
    }
    assert_eq!(target.export_snapshot().unwrap().0, bytes);
    let again = apply_one(
        &target,
        20,
        vec![request("r1", A, submit("d2", &["eu"], 1))],
    );
    assert_eq!(again[0], first[0]);
    // The age index came along: compaction finds the records.
    let out = apply_one(
        &target,
        30,
        vec![Mutation::Compact(crate::mutations::Compact {
            created_before_ms: 0,
            rows_max: 10,
            requests_created_before_ms: 11,
            keep_rows_min: 0,
        })],
    );
    assert!(
        matches!(
            out[0],
            Ok(Outcome::Compacted {
                requests_deleted: 2,
                ..
            })
        ),
        "{out:?}"
    );
}
