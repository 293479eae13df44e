//! Notifications: webhook endpoints and the deliveries of the events
//! workflow transitions announce.
//!
//! - **Creating.** Apply code that makes a transition worth announcing
//!   calls `Applier::notify` in the same transaction: the event gets the
//!   next event id (`meta::NOTIFY_EVENT_SEQ`, the same on every replica)
//!   and one [`Delivery`] per endpoint, `pending`, due at once. A
//!   transition never fails because of its notification.
//! - **Delivering.** The leader's delivery job reads the pending ones by
//!   due time (`PENDING_DELIVERIES`), POSTs, and records each attempt with
//!   a guarded [`Mutation::Deliver`]: `delivered`, `failed` (attempts + 1,
//!   the error, the next attempt time the leader computed), or `gave up`
//!   (`dead`). The guard is the delivery's state and revision
//!   ([`wire::rules::notify`]), so a deposed leader's late result, or the
//!   same one twice, changes nothing.
//! - **Replaying.** An operator makes a `dead` or `delivered` delivery
//!   pending again, attempts reset.
//! - **The bound.** At most [`crate::DELIVERIES_MAX`] deliveries are kept.
//!   To make room for new ones, the oldest *delivered* ones are deleted. Pending
//!   and dead ones are never deleted: if the table is full of them, the
//!   new deliveries are not stored and counted in `meta::NOTIFY_DROPPED`
//!   (shown by `ctrl notify deliveries`, logged by the delivery job).
//!
//! [`Mutation::Deliver`]: crate::Mutation::Deliver

use redb::{ReadableTable, ReadableTableMetadata};
use wire::notify::{
    AddEndpoint, DELIVERY_ERROR_BYTES_MAX, Delivery, DeliveryState, ENDPOINTS_MAX, NotifyEndpoint,
    NotifyEvent,
};
use wire::rules::notify::delivery_guard;
use wire::rules::truncate;

use super::{Applier, OP, bad_request, conflict, failed_precondition, guard_refusal, not_found};
use crate::command::{DeliveryAction, DeliveryTransition, MutationResult, Outcome};
use crate::error::{RedbContext, Result};
use crate::tables::{self, decode, encode, load, load_raw, meta, name};

/// The error reason a delivery of a removed endpoint is given up with.
const ENDPOINT_REMOVED: &str = "endpoint removed";

impl Applier<'_> {
    fn meta_u64(&self, key: &'static str) -> Result<u64> {
        match load_raw(&self.t.metadata, key)? {
            Some(bytes) => tables::decode_u64(key, &bytes),
            None => Ok(0),
        }
    }

    /// Whether an endpoint of that name exists.
    pub(super) fn endpoint_exists(&self, endpoint: &str) -> Result<bool> {
        Ok(self.endpoint(endpoint)?.is_some())
    }

    fn endpoint(&self, endpoint: &str) -> Result<Option<NotifyEndpoint>> {
        load(&self.t.notify_endpoints, name::NOTIFY_ENDPOINTS, endpoint)
    }

    fn endpoint_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in self
            .t
            .notify_endpoints
            .iter()
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?
        {
            let (key, _) = entry.ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
            names.push(key.value().to_string());
        }
        Ok(names)
    }

    fn delivery(&self, id: u64) -> Result<Option<Delivery>> {
        load(&self.t.deliveries, name::DELIVERIES, id)
    }

    /// Writes a delivery and keeps the pending index in step (`was`: the
    /// row it replaces, if any).
    fn put_delivery(&mut self, delivery: &Delivery, was: Option<&Delivery>) -> Result<()> {
        if let Some(was) = was
            && was.state == DeliveryState::Pending
        {
            self.t
                .pending_deliveries
                .remove((was.next_attempt_at_ms, was.id))
                .ctx_table(OP, name::PENDING_DELIVERIES)?;
        }
        let bytes = encode("a delivery", delivery)?;
        self.t
            .deliveries
            .insert(delivery.id, bytes.as_slice())
            .ctx_table(OP, name::DELIVERIES)?;
        if delivery.state == DeliveryState::Pending {
            self.t
                .pending_deliveries
                .insert((delivery.next_attempt_at_ms, delivery.id), ())
                .ctx_table(OP, name::PENDING_DELIVERIES)?;
        }
        Ok(())
    }

    /// Announces `event`: one pending delivery, due now, to each endpoint
    /// (only to `to` when named; nothing if it does not exist), all with
    /// the next event id. Call it in the apply of the transition the event
    /// announces. At the bound, the oldest delivered deliveries make room;
    /// deliveries that still do not fit are counted as dropped. Returns the
    /// event id (also when no endpoint is configured, so ids stay
    /// gap-free per event).
    pub(crate) fn notify(&mut self, event: NotifyEvent, to: Option<&str>) -> Result<u64> {
        let event_id = self.meta_u64(meta::NOTIFY_EVENT_SEQ)? + 1;
        self.t.put_meta_u64(meta::NOTIFY_EVENT_SEQ, event_id)?;
        let endpoints: Vec<String> = match to {
            Some(only) => self.endpoint(only)?.map(|e| e.name).into_iter().collect(),
            None => self.endpoint_names()?,
        };
        if endpoints.is_empty() {
            return Ok(event_id);
        }
        let wanted = u64::try_from(endpoints.len()).unwrap_or(u64::MAX);
        let room = self.make_room(wanted)?;
        let mut next_id = self.meta_u64(meta::DELIVERY_SEQ)?;
        for endpoint in endpoints
            .into_iter()
            .take(usize::try_from(room).unwrap_or(0))
        {
            next_id += 1;
            let delivery = Delivery {
                id: next_id,
                event_id,
                endpoint,
                event: event.clone(),
                created_at_ms: self.now_ms,
                state: DeliveryState::Pending,
                revision: 1,
                attempts: 0,
                next_attempt_at_ms: self.now_ms,
                last_attempt_at_ms: None,
                last_error: None,
                delivered_at_ms: None,
            };
            self.put_delivery(&delivery, None)?;
        }
        self.t.put_meta_u64(meta::DELIVERY_SEQ, next_id)?;
        if room < wanted {
            let dropped = self.meta_u64(meta::NOTIFY_DROPPED)? + (wanted - room);
            self.t.put_meta_u64(meta::NOTIFY_DROPPED, dropped)?;
        }
        Ok(event_id)
    }

    /// Makes room for `wanted` more deliveries by deleting the oldest
    /// delivered ones; how many fit now (at most `wanted`).
    fn make_room(&mut self, wanted: u64) -> Result<u64> {
        let count = self.t.deliveries.len().ctx_table(OP, name::DELIVERIES)?;
        let excess = (count + wanted).saturating_sub(self.deliveries_max);
        if excess == 0 {
            return Ok(wanted);
        }
        let mut doomed = Vec::new();
        for entry in self.t.deliveries.iter().ctx_table(OP, name::DELIVERIES)? {
            if doomed.len() as u64 >= excess {
                break;
            }
            let (key, value) = entry.ctx_table(OP, name::DELIVERIES)?;
            let row: Delivery = decode(name::DELIVERIES, &key.value(), value.value())?;
            if row.state == DeliveryState::Delivered {
                doomed.push(row.id);
            }
        }
        for id in &doomed {
            self.t
                .deliveries
                .remove(id)
                .ctx_table(OP, name::DELIVERIES)?;
        }
        let count = count - doomed.len() as u64;
        Ok(self.deliveries_max.saturating_sub(count).min(wanted))
    }

    pub(super) fn add_notify_endpoint(
        &mut self,
        endpoint: &NotifyEndpoint,
    ) -> Result<MutationResult> {
        let request = AddEndpoint {
            name: endpoint.name.clone(),
            url: endpoint.url.clone(),
            secret: endpoint.secret.clone(),
        };
        if let Err(e) = request.validate() {
            return Ok(Err(e));
        }
        if self.endpoint(&endpoint.name)?.is_some() {
            return Ok(conflict(format!(
                "endpoint {:?} exists; remove it first to change it",
                endpoint.name
            )));
        }
        let count = self
            .t
            .notify_endpoints
            .len()
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
        if count >= ENDPOINTS_MAX as u64 {
            return Ok(bad_request(format!(
                "the cluster already has {ENDPOINTS_MAX} endpoints"
            )));
        }
        let mut row = endpoint.clone();
        row.created_at_ms = self.now_ms;
        let bytes = encode("an endpoint", &row)?;
        self.t
            .notify_endpoints
            .insert(row.name.as_str(), bytes.as_slice())
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn remove_notify_endpoint(&mut self, endpoint: &str) -> Result<MutationResult> {
        if self.endpoint(endpoint)?.is_none() {
            return Ok(not_found(format!("no endpoint {endpoint:?}")));
        }
        self.t
            .notify_endpoints
            .remove(endpoint)
            .ctx_table(OP, name::NOTIFY_ENDPOINTS)?;
        let mut pending = Vec::new();
        for entry in self
            .t
            .pending_deliveries
            .iter()
            .ctx_table(OP, name::PENDING_DELIVERIES)?
        {
            let (key, _) = entry.ctx_table(OP, name::PENDING_DELIVERIES)?;
            pending.push(key.value().1);
        }
        let mut dead = 0;
        for id in pending {
            let Some(was) = self.delivery(id)? else {
                continue;
            };
            if was.endpoint != endpoint {
                continue;
            }
            let mut row = was.clone();
            row.state = DeliveryState::Dead;
            row.revision += 1;
            row.last_error = Some(ENDPOINT_REMOVED.to_string());
            self.put_delivery(&row, Some(&was))?;
            dead += 1;
        }
        Ok(Ok(Outcome::EndpointRemoved {
            deliveries_dead: dead,
        }))
    }

    pub(super) fn delivery_transition(
        &mut self,
        transition: &DeliveryTransition,
    ) -> Result<MutationResult> {
        let found = self.delivery(transition.delivery_id)?;
        let found_guard = found.as_ref().map(delivery_guard);
        if let Some(refusal) = guard_refusal(&transition.expected, found_guard) {
            return Ok(Ok(refusal));
        }
        let Some(was) = found else {
            // The guard held, so the record exists.
            return Ok(not_found(format!("no delivery {}", transition.delivery_id)));
        };
        if was.state != DeliveryState::Pending {
            return Ok(failed_precondition(format!(
                "delivery {} is {}, not pending",
                was.id,
                was.state.as_str()
            )));
        }
        let mut row = was.clone();
        row.revision += 1;
        row.attempts = row.attempts.saturating_add(1);
        row.last_attempt_at_ms = Some(self.now_ms);
        match &transition.action {
            DeliveryAction::Delivered => {
                row.state = DeliveryState::Delivered;
                row.delivered_at_ms = Some(self.now_ms);
            }
            DeliveryAction::Failed {
                error,
                next_attempt_at_ms,
            } => {
                row.last_error = Some(truncate(error, DELIVERY_ERROR_BYTES_MAX));
                row.next_attempt_at_ms = *next_attempt_at_ms;
            }
            DeliveryAction::GaveUp { error } => {
                row.state = DeliveryState::Dead;
                row.last_error = Some(truncate(error, DELIVERY_ERROR_BYTES_MAX));
            }
        }
        self.put_delivery(&row, Some(&was))?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn replay_delivery(&mut self, id: u64) -> Result<MutationResult> {
        let Some(was) = self.delivery(id)? else {
            return Ok(not_found(format!("no delivery {id}")));
        };
        if was.state == DeliveryState::Pending {
            return Ok(failed_precondition(format!(
                "delivery {id} is pending already"
            )));
        }
        if self.endpoint(&was.endpoint)?.is_none() {
            return Ok(failed_precondition(format!(
                "delivery {id}'s endpoint {:?} was removed",
                was.endpoint
            )));
        }
        let mut row = was.clone();
        row.state = DeliveryState::Pending;
        row.revision += 1;
        row.attempts = 0;
        row.next_attempt_at_ms = self.now_ms;
        row.delivered_at_ms = None;
        self.put_delivery(&row, Some(&was))?;
        Ok(Ok(Outcome::Recorded))
    }
}

#[cfg(test)]
mod tests;
