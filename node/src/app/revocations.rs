//! Certificate revocation as operators use it — revoke (validated here for
//! a quick answer, and again in apply), list — and the node's copy of
//! every revocation ([`RevocationList`]), which the server consults for
//! each connection and each stream. The copy is reloaded by
//! [`follow`] whenever apply writes a revocation (or a snapshot is
//! installed), and every open connection re-checks its certificate then
//! ([`RevocationList::changed`]).

use std::sync::{Arc, RwLock, Weak};

use storage::command::Touched;
use storage::mutations;
use tokio::sync::watch;
use tracing::{debug, error};
use wire::WireError;
use wire::operator::request::RevokeCertificate;
use wire::revocation::{Presented, Revocation, RevocationSet};

use super::{Propose, ReadState, internal, propose};

/// Revokes the request's target; returns the revocation as committed (the
/// earlier one if the target was already revoked).
pub async fn revoke(
    state: &impl Propose,
    request: RevokeCertificate,
) -> Result<Revocation, WireError> {
    request.validate()?;
    propose(
        state,
        mutations::Revoke {
            target: request.target,
            reason: request.reason,
        },
    )
    .await
}

/// Every revocation, by key.
pub fn list(state: &impl ReadState) -> Result<Vec<Revocation>, WireError> {
    state
        .read()
        .map_err(internal)?
        .revocations()
        .map_err(internal)
}

/// This node's copy of every revocation, and a generation that moves each
/// time it is reloaded.
#[derive(Debug)]
pub struct RevocationList {
    set: RwLock<Arc<RevocationSet>>,
    generation: watch::Sender<u64>,
}

impl Default for RevocationList {
    fn default() -> Self {
        RevocationList {
            set: RwLock::new(Arc::new(RevocationSet::default())),
            generation: watch::channel(0).0,
        }
    }
}

impl RevocationList {
    /// The revocation that refuses `presented`, if one does.
    pub fn refusal(&self, presented: &Presented<'_>) -> Option<Revocation> {
        self.current().refusal(presented).cloned()
    }

    /// The set as it is now.
    pub fn current(&self) -> Arc<RevocationSet> {
        match self.set.read() {
            Ok(set) => set.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A receiver that changes at each reload, for a connection to check
    /// its certificate again.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Replaces the set with `revocations` and moves the generation.
    pub fn replace(&self, revocations: Vec<Revocation>) {
        let set = Arc::new(RevocationSet::new(revocations));
        match self.set.write() {
            Ok(mut slot) => *slot = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Reads every revocation from `state` into the set.
    pub fn reload(&self, state: &impl ReadState) -> Result<usize, WireError> {
        let revocations = list(state)?;
        let count = revocations.len();
        self.replace(revocations);
        Ok(count)
    }
}

/// Keeps `list` equal to the replicated revocations: loads them now, then
/// again each time apply writes one (or installs a snapshot). Ends when
/// the state is gone or has no wake-ups to give (a state without them is
/// loaded once); holds the state only while it reads. A failed read is
/// logged and retried at the next wake-up.
pub async fn follow<S: ReadState>(state: Weak<S>, list: Arc<RevocationList>) {
    loop {
        let woken = {
            let Some(state) = state.upgrade() else {
                return;
            };
            // Subscribed before the read: a revocation applied between
            // the two wakes this loop again.
            let woken = state.subscribe_touched(&Touched::Revocations);
            match list.reload(&*state) {
                Ok(count) => debug!(count, "revocations loaded"),
                Err(e) => error!("reading the revocations failed: {e}"),
            }
            woken
        };
        let Some(mut woken) = woken else {
            return;
        };
        if woken.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::testing::MemoryNode;
    use wire::ErrorCode;
    use wire::revocation::{Holder, RevokedTarget};

    fn revoke_alice(reason: &str) -> RevokeCertificate {
        RevokeCertificate {
            target: RevokedTarget::Operator("alice".into()),
            reason: reason.into(),
        }
    }

    #[tokio::test]
    async fn a_revocation_is_stored_once_and_listed() {
        let state = MemoryNode::new();
        let first = revoke(&state, revoke_alice("laptop lost")).await.unwrap();
        assert_eq!(first.target, RevokedTarget::Operator("alice".into()));
        assert_eq!(first.reason, "laptop lost");
        // The same target again: the first revocation stands.
        let again = revoke(&state, revoke_alice("again")).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(list(&state).unwrap(), vec![first]);
    }

    #[tokio::test]
    async fn a_bad_target_or_reason_is_refused_and_writes_nothing() {
        let state = MemoryNode::new();
        for request in [
            RevokeCertificate {
                target: RevokedTarget::Serial("0XAB".into()),
                reason: "lost".into(),
            },
            RevokeCertificate {
                target: RevokedTarget::Agent("Not A Region".into()),
                reason: "lost".into(),
            },
            revoke_alice(" "),
        ] {
            let e = revoke(&state, request.clone()).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{request:?}: {e}");
        }
        assert!(list(&state).unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_list_follows_apply_and_moves_its_generation() {
        let state = Arc::new(MemoryNode::new());
        let revocations = Arc::new(RevocationList::default());
        let mut changed = revocations.changed();
        let follower = tokio::spawn(follow(Arc::downgrade(&state), revocations.clone()));
        // The first load.
        tokio::time::timeout(std::time::Duration::from_secs(5), changed.changed())
            .await
            .expect("loaded in time")
            .unwrap();
        let alice = Presented {
            holder: Holder::Operator("alice"),
            serial: "1",
            not_before_ms: 0,
        };
        assert!(revocations.refusal(&alice).is_none());
        revoke(&*state, revoke_alice("laptop lost")).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), changed.changed())
            .await
            .expect("reloaded in time")
            .unwrap();
        let refused = revocations.refusal(&alice).expect("alice is refused");
        assert_eq!(refused.reason, "laptop lost");
        follower.abort();
    }
}
