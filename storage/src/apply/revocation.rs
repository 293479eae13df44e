//! Revocations: a certificate target withdrawn for good, stamped with the
//! command's time and its caller. The first revocation of a target stays
//! (its time decides which certificates a name revocation covers).

use wire::model::Actor;
use wire::revocation::{REVOCATIONS_MAX, Revocation, RevokedTarget};

use super::{Applier, bad_request};
use crate::command::{MutationResult, Outcome, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{encode, load, name};

const OP: &str = "apply: revoke";

impl Applier<'_> {
    pub(super) fn revoke(
        &mut self,
        target: &RevokedTarget,
        reason: &str,
    ) -> Result<MutationResult> {
        if let Err(refused) = target
            .validate()
            .and_then(|()| wire::revocation::validate_reason(reason))
        {
            return Ok(Err(refused));
        }
        let key = target.key();
        let existing: Option<Revocation> =
            load(&self.t.revocations, name::REVOCATIONS, key.as_str())?;
        if let Some(existing) = existing {
            return Ok(Ok(Outcome::Revoked(existing)));
        }
        let held = redb::ReadableTableMetadata::len(&self.t.revocations)
            .ctx_table(OP, name::REVOCATIONS)?;
        if held >= REVOCATIONS_MAX as u64 {
            return Ok(bad_request(format!(
                "the cluster already keeps {REVOCATIONS_MAX} revocations, its most; rotate the CA instead"
            )));
        }
        let revoked_by = match &self.caller {
            Some(caller) => caller.actor.clone(),
            None => Actor::Workflow.to_string(),
        };
        let revocation = Revocation {
            target: target.clone(),
            reason: reason.to_string(),
            revoked_at_ms: self.now_ms,
            revoked_by,
        };
        let bytes = encode("a revocation", &revocation)?;
        self.t
            .revocations
            .insert(key.as_str(), bytes.as_slice())
            .ctx_table(OP, name::REVOCATIONS)?;
        self.touch(Touched::Revocations);
        Ok(Ok(Outcome::Revoked(revocation)))
    }
}

#[cfg(test)]
mod tests;
