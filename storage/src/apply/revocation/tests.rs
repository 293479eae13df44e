//! Tests of `storage/src/apply/revocation`.
use wire::ErrorCode;
use wire::revocation::{REVOCATIONS_MAX, RevokedTarget};

use crate::command::{Mutation, Outcome, Touched};
use crate::test_support::*;
use crate::{Command, Store};

fn revoke(target: RevokedTarget, reason: &str) -> Mutation {
    Mutation::Revoke(crate::mutations::Revoke {
        target,
        reason: reason.into(),
    })
}

fn alice() -> RevokedTarget {
    RevokedTarget::Operator("alice".into())
}

fn hash(store: &Store) -> u64 {
    store.read().unwrap().state_hash().unwrap()
}

#[test]
fn a_revocation_is_stamped_with_the_entry_and_its_caller_and_kept_once() {
    let store = Store::in_memory().unwrap();
    let by_admin = Mutation::Request(crate::mutations::Request {
        request_id: "req-1".into(),
        fingerprint: [1; 32],
        actor: "ctrl://operator/root/admin".into(),
        mutation: Box::new(revoke(alice(), "laptop lost")),
    });
    let command = Command {
        now_ms: 42,
        mutations: vec![by_admin],
    };
    let applied = store
        .apply(&[Some(&command)], &raft_meta(42), true)
        .unwrap();
    let Ok(Outcome::Revoked(first)) = &applied.outcomes[0][0] else {
        panic!("{:?}", applied.outcomes);
    };
    assert_eq!(first.revoked_at_ms, 42, "the entry's time");
    assert_eq!(first.revoked_by, "ctrl://operator/root/admin");
    assert!(applied.touched.contains(&Touched::Revocations));

    // The same target again, later and for another reason: the first
    // revocation stands, nothing is written, nobody is woken.
    let before = hash(&store);
    let again = apply_one(&store, 99, vec![revoke(alice(), "again")]);
    assert_eq!(again, vec![Ok(Outcome::Revoked(first.clone()))]);
    assert_eq!(hash(&store), before);
    assert_eq!(
        store.read().unwrap().revocations().unwrap(),
        vec![first.clone()]
    );
    assert_eq!(
        store.read().unwrap().revocation(&alice()).unwrap(),
        Some(first.clone())
    );
}

#[test]
fn a_malformed_target_or_reason_is_refused_and_writes_nothing() {
    let store = Store::in_memory().unwrap();
    let before = hash(&store);
    for mutation in [
        revoke(RevokedTarget::Serial("00ab".into()), "lost"),
        revoke(RevokedTarget::Operator("Alice".into()), "lost"),
        revoke(RevokedTarget::Agent("eu west".into()), "lost"),
        revoke(alice(), ""),
    ] {
        let out = apply_one(&store, 5, vec![mutation.clone()]);
        assert_eq!(
            out[0].as_ref().unwrap_err().code,
            ErrorCode::BadRequest,
            "{mutation:?}"
        );
    }
    assert_eq!(hash(&store), before);
}

#[test]
fn no_more_than_the_bound_is_kept() {
    let store = Store::in_memory().unwrap();
    let mutations: Vec<Mutation> = (0..REVOCATIONS_MAX)
        .map(|n| revoke(RevokedTarget::Serial(format!("{:x}", n + 1)), "rotated"))
        .collect();
    let out = apply_one(&store, 5, mutations);
    assert!(out.iter().all(|r| r.is_ok()));
    let one_more = apply_one(&store, 6, vec![revoke(alice(), "lost")]);
    let refused = one_more[0].as_ref().unwrap_err();
    assert_eq!(refused.code, ErrorCode::BadRequest);
    assert!(refused.message.contains("rotate the CA"), "{refused}");
    assert_eq!(
        store.read().unwrap().revocations().unwrap().len(),
        REVOCATIONS_MAX
    );
}
