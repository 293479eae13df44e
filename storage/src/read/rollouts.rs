//! Fleet rollouts: the current one and the history.

use redb::ReadableTable;
use wire::rollout::Rollout;

use super::{OP, ReadView};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, name};

impl ReadView {
    /// The newest rollout, if there ever was one.
    pub fn latest_rollout(&self) -> Result<Option<Rollout>> {
        match self.rollouts.last().ctx_table(OP, name::ROLLOUTS)? {
            Some((key, value)) => decode(name::ROLLOUTS, &key.value(), value.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The rollouts, newest first, at most `limit`.
    pub fn rollouts(&self, limit: usize) -> Result<Vec<Rollout>> {
        let mut out = Vec::new();
        let rows = self.rollouts.iter().ctx_table(OP, name::ROLLOUTS)?;
        for entry in rows.rev().take(limit) {
            let (key, value) = entry.ctx_table(OP, name::ROLLOUTS)?;
            out.push(decode(name::ROLLOUTS, &key.value(), value.value())?);
        }
        Ok(out)
    }
}
