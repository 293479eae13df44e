//! The rules of a notification delivery's attempts: each is recorded by a
//! guarded transition whose guard is the delivery's state by name and its
//! revision ([`delivery_guard`]), so a deposed leader's late result, or
//! the same one twice, changes nothing.

use crate::notify::Delivery;
use crate::rules::Guard;

/// A delivery's guard: its state and revision.
pub fn delivery_guard(delivery: &Delivery) -> Guard {
    Guard {
        step: delivery.state.as_str().to_string(),
        revision: delivery.revision,
    }
}
