//! The records of operator requests made with an id.

use redb::{ReadableTable, ReadableTableMetadata};
use wire::model::UnixMs;

use super::{OP, ReadView};
use crate::error::{RedbContext, Result};
use crate::tables::{RequestRecord, load, name};

impl ReadView {
    /// The record of the operator request `request_id`, if it is kept.
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>> {
        load(&self.requests, name::REQUESTS, request_id)
    }

    /// The time of the oldest request record still kept (`None`: none).
    pub fn oldest_request_ms(&self) -> Result<Option<UnixMs>> {
        let first = self
            .requests_by_age
            .first()
            .ctx_table(OP, name::REQUESTS_BY_AGE)?;
        Ok(first.map(|(key, _)| key.value().0))
    }

    /// How many request records are kept.
    pub fn request_count(&self) -> Result<u64> {
        self.requests.len().ctx_table(OP, name::REQUESTS)
    }
}
