//! Sentinels: the per-environment, per-region proxy. An upsert creates or
//! replaces the row with a new version (a pk) and a change row, keeping the
//! first `created_at_ms`; a status report records what krane observed and
//! writes no change row.

use redb::ReadableTable;
use wire::model::{ResourceType, Sentinel, SentinelStatus};

use super::{Applier, OP, bad_request, not_found};
use crate::command::{MutationResult, Outcome};
use crate::error::{RedbContext, Result};
use crate::read::load;
use crate::tables::{encode, name};

impl Applier<'_> {
    pub(super) fn upsert_sentinel(&mut self, sentinel: &Sentinel) -> Result<MutationResult> {
        if sentinel.id.is_empty() || sentinel.region.is_empty() {
            return Ok(bad_request("a sentinel needs an id and a region"));
        }
        let key = (sentinel.region.as_str(), sentinel.id.as_str());
        let existing: Option<Sentinel> = load(&self.t.sentinels, name::SENTINELS, key)?;
        let mut row = sentinel.clone();
        row.version = self.record_change(ResourceType::Sentinel, &sentinel.id, &sentinel.region)?;
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        let bytes = encode("a sentinel", &row)?;
        self.t
            .sentinels
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINELS)?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn report_sentinel_status(
        &mut self,
        status: &SentinelStatus,
    ) -> Result<MutationResult> {
        let key = (status.region.as_str(), status.sentinel_id.as_str());
        let exists = self.t.sentinels.get(key).ctx_table(OP, name::SENTINELS)?;
        if exists.is_none() {
            return Ok(not_found(format!(
                "no sentinel {:?} in region {:?}",
                status.sentinel_id, status.region
            )));
        }
        drop(exists);
        let bytes = encode("a sentinel status", status)?;
        self.t
            .sentinel_status
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::SENTINEL_STATUS)?;
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
}
