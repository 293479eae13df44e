//! Notifications: webhook endpoints, deliveries (the pending ones by due
//! time), and the counters of events, deliveries and those dropped at the
//! table's bound.

use redb::ReadableTable;
use wire::notify::{Delivery, NotifyEndpoint};

use super::{OP, ReadView};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{decode, load, name};

impl ReadView {
    /// The id of the newest notification event (0: none yet).
    pub fn notify_event_seq(&self) -> u64 {
        self.notify_event_seq
    }

    /// The id of the newest delivery (0: none yet).
    pub fn delivery_seq(&self) -> u64 {
        self.delivery_seq
    }

    /// Every webhook endpoint, by name (with its secret: for the delivery
    /// job; operators are shown [`wire::notify::EndpointView`]s).
    pub fn notify_endpoints(&self) -> Result<Vec<NotifyEndpoint>> {
        let mut out = Vec::new();
        for entry in self
            .notify_endpoints
            .iter()
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?
        {
            let (key, value) = entry.ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
            out.push(decode(name::NOTIFY_ENDPOINTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The delivery `id`, if it is kept.
    pub fn delivery(&self, id: u64) -> Result<Option<Delivery>> {
        load(&self.deliveries, name::DELIVERIES, id)
    }

    /// Deliveries with ids after `after`, oldest first, at most `limit`.
    pub fn deliveries(&self, after: u64, limit: usize) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let range = self
            .deliveries
            .range(after.saturating_add(1)..)
            .ctx_table(OP, name::DELIVERIES)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::DELIVERIES)?;
            out.push(decode(name::DELIVERIES, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// Pending deliveries, the earliest due first, at most `limit`
    /// (whether due yet or not: the caller compares with its clock).
    pub fn pending_deliveries(&self, limit: usize) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        let range = self
            .pending_deliveries
            .iter()
            .ctx_table(OP, name::PENDING_DELIVERIES)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::PENDING_DELIVERIES)?;
            let (_, id) = key.value();
            let delivery = self.delivery(id)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::PENDING_DELIVERIES,
                    &id,
                    "a pending delivery that does not exist",
                )
            })?;
            out.push(delivery);
        }
        Ok(out)
    }

    /// Deliveries never stored because the table was full of undelivered
    /// ones (see [`crate::DELIVERIES_MAX`]).
    pub fn notify_dropped(&self) -> u64 {
        self.notify_dropped
    }
}
