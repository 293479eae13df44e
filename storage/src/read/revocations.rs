//! Revocations: every revoked certificate target, read whole (a node
//! keeps them in memory and checks each connection and stream against
//! them), and one by target.

use redb::ReadableTable;
use wire::revocation::{Revocation, RevokedTarget};

use super::{OP, ReadView};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, load, name};

impl ReadView {
    /// Every revocation, by key.
    pub fn revocations(&self) -> Result<Vec<Revocation>> {
        let mut out = Vec::new();
        for entry in self.revocations.iter().ctx_table(OP, name::REVOCATIONS)? {
            let (key, value) = entry.ctx_table(OP, name::REVOCATIONS)?;
            out.push(decode(name::REVOCATIONS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The revocation of `target`, if there is one.
    pub fn revocation(&self, target: &RevokedTarget) -> Result<Option<Revocation>> {
        load(&self.revocations, name::REVOCATIONS, target.key().as_str())
    }
}
