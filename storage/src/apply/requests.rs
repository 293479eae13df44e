//! Operator requests made with an id ([`Mutation::Request`]): each id is
//! recorded with the fingerprint of its request and the result its
//! mutation got, in the transaction that applied it. A retry (the same id
//! and fingerprint) gets the recorded result and writes nothing; another
//! request under the same id is refused (`Conflict`) and writes nothing.
//!
//! The records are bounded: compaction deletes those older than the
//! retention it is given, oldest first, and storing a record while
//! [`crate::REQUESTS_MAX`] are kept evicts the oldest. "Oldest" is the order of
//! the `requests_by_age` index, `(created_at_ms, request_id)`, written
//! and deleted together with each record.

use redb::{ReadableTable, ReadableTableMetadata};
use wire::model::UnixMs;
use wire::operator::validate_request_id;

use super::{Applier, OP, bad_request, conflict};
use crate::command::{ACTOR_BYTES_MAX, Caller, Fingerprint, Mutation, MutationResult};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{RequestRecord, encode, load, name};

impl Applier<'_> {
    /// Applies `mutation` once per request id; see the module doc.
    pub(super) fn request(
        &mut self,
        request_id: &str,
        fingerprint: &Fingerprint,
        actor: &str,
        mutation: &Mutation,
    ) -> Result<MutationResult> {
        if let Err(e) = validate_request_id(request_id) {
            return Ok(Err(e));
        }
        if actor.is_empty() || actor.len() > ACTOR_BYTES_MAX {
            return Ok(bad_request(format!(
                "a request's actor must be 1 to {ACTOR_BYTES_MAX} bytes"
            )));
        }
        if matches!(mutation, Mutation::Request(_)) {
            return Ok(bad_request("a request cannot wrap another request"));
        }
        let recorded: Option<RequestRecord> = load(&self.t.requests, name::REQUESTS, request_id)?;
        if let Some(record) = recorded {
            if record.fingerprint == *fingerprint {
                return Ok(record.result);
            }
            return Ok(conflict(format!(
                "request id {request_id:?} was already used by {} for another request",
                record.actor
            )));
        }
        self.caller = Some(Caller {
            request_id: request_id.to_string(),
            actor: actor.to_string(),
        });
        let result = self.mutation(mutation);
        self.caller = None;
        let result = result?;
        let record = RequestRecord {
            fingerprint: *fingerprint,
            result: result.clone(),
            created_at_ms: self.now_ms,
            actor: actor.to_string(),
        };
        self.record_request(request_id, &record)?;
        Ok(result)
    }

    /// Stores a new record and its index row, evicting the oldest records
    /// first while the store's maximum ([`crate::REQUESTS_MAX`]) is kept.
    fn record_request(&mut self, request_id: &str, record: &RequestRecord) -> Result<()> {
        while self.t.requests.len().ctx_table(OP, name::REQUESTS)? >= self.requests_max {
            if self.delete_oldest_request(UnixMs::MAX)?.is_none() {
                return Err(StorageError::corrupt(
                    name::REQUESTS_BY_AGE,
                    &"first",
                    "request records without index rows",
                ));
            }
        }
        let bytes = encode("a request record", record)?;
        self.t
            .requests
            .insert(request_id, bytes.as_slice())
            .ctx_table(OP, name::REQUESTS)?;
        self.t
            .requests_by_age
            .insert((record.created_at_ms, request_id), ())
            .ctx_table(OP, name::REQUESTS_BY_AGE)?;
        Ok(())
    }

    /// Deletes the records created before `created_before_ms`, oldest
    /// first, at most `rows_max`; returns how many went.
    pub(super) fn expire_requests(
        &mut self,
        created_before_ms: UnixMs,
        rows_max: u32,
    ) -> Result<u64> {
        let mut deleted = 0;
        while deleted < u64::from(rows_max) {
            if self.delete_oldest_request(created_before_ms)?.is_none() {
                break;
            }
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Deletes the oldest record if it was created before
    /// `created_before_ms`; returns its id, `None` if there was none.
    fn delete_oldest_request(&mut self, created_before_ms: UnixMs) -> Result<Option<String>> {
        let oldest = {
            let first = self
                .t
                .requests_by_age
                .first()
                .ctx_table(OP, name::REQUESTS_BY_AGE)?;
            first.map(|(key, _)| {
                let (created_at_ms, id) = key.value();
                (created_at_ms, id.to_string())
            })
        };
        let Some((created_at_ms, id)) = oldest else {
            return Ok(None);
        };
        if created_at_ms >= created_before_ms {
            return Ok(None);
        }
        self.t
            .requests_by_age
            .remove((created_at_ms, id.as_str()))
            .ctx_table(OP, name::REQUESTS_BY_AGE)?;
        let removed = self
            .t
            .requests
            .remove(id.as_str())
            .ctx_table(OP, name::REQUESTS)?
            .is_some();
        if !removed {
            return Err(StorageError::corrupt(
                name::REQUESTS_BY_AGE,
                &(created_at_ms, &id),
                "indexes a request record that does not exist",
            ));
        }
        Ok(Some(id))
    }
}

#[cfg(test)]
mod tests;
