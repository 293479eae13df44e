//! Webhook notifications as the leader sends them: what is POSTed for a
//! delivery ([`body`], [`signature`]), and what an attempt's result means
//! for the delivery ([`decide`]: delivered, retry later with exponential
//! backoff, or give up as `dead`). Pure: the time is passed in, so the
//! decisions are tested with a fixed clock. [`send`] is the HTTP client;
//! `jobs::notify` the leader job that drives both.
//!
//! The records' guarded writes and the table's bound
//! ([`storage::DELIVERIES_MAX`]) live in storage, a delivery's guard in
//! [`wire::rules::notify`].

pub mod send;

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use config::NotifySettings;
use storage::command::DeliveryAction;
use wire::notify::Delivery;

/// What prefixes the hex HMAC in the signature header.
pub const SIGNATURE_PREFIX: &str = "sha256=";

/// The JSON body POSTed for `delivery`: `text` (what Slack-compatible
/// receivers — Mattermost, Rocket.Chat — show), the event id (also in
/// the `x-ctrl-event-id` header), its kind, when it was created, and the
/// event's fields under `data`. The same bytes on every attempt.
pub fn body(delivery: &Delivery) -> Vec<u8> {
    // An externally tagged enum serializes as {"Variant": {fields}}.
    let data = match serde_json::to_value(&delivery.event) {
        Ok(serde_json::Value::Object(mut map)) if map.len() == 1 => {
            map.values_mut().next().map(std::mem::take)
        }
        _ => None,
    }
    .unwrap_or_default();
    let value = serde_json::json!({
        "text": delivery.event.text(),
        "event_id": delivery.event_id.to_string(),
        "kind": delivery.event.kind(),
        "created_at_ms": delivery.created_at_ms,
        "data": data,
    });
    // A JSON value of strings and numbers always serializes.
    serde_json::to_vec(&value).unwrap_or_default()
}

/// `sha256=<hex HMAC-SHA256 of body under secret>`, the signature
/// header's value.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body);
    let mut out = String::with_capacity(SIGNATURE_PREFIX.len() + 64);
    out.push_str(SIGNATURE_PREFIX);
    for byte in tag.as_ref() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Most steps [`backoff_ms`] takes through the backoff sequence.
const BACKOFF_STEPS_MAX: u32 = 64;

/// How long to wait after the `failures`-th failed attempt (from 1):
/// `backoff_initial_ms`, doubled each time, at most `backoff_max_ms`.
pub fn backoff_ms(settings: &NotifySettings, failures: u32) -> u64 {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(settings.backoff_initial_ms))
        .with_max_delay(Duration::from_millis(settings.backoff_max_ms))
        .with_factor(2.0)
        .without_max_times()
        .build();
    // Past 64 doublings any delay is at the cap: no need to step further.
    let nth = usize::try_from(failures.saturating_sub(1).min(BACKOFF_STEPS_MAX)).unwrap_or(0);
    delays
        .nth(nth)
        .map_or(settings.backoff_max_ms, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
        })
        .min(settings.backoff_max_ms)
}

/// What to record of an attempt on `delivery` that ended at `now_ms` with
/// `result` (`Err`: why it failed): delivered; failed with the next
/// attempt due after the backoff; or, when this was attempt
/// `max_attempts`, given up.
pub fn decide(
    delivery: &Delivery,
    result: Result<(), String>,
    settings: &NotifySettings,
    now_ms: u64,
) -> DeliveryAction {
    let error = match result {
        Ok(()) => return DeliveryAction::Delivered,
        Err(error) => error,
    };
    let failures = delivery.attempts.saturating_add(1);
    if failures >= settings.max_attempts {
        return DeliveryAction::GaveUp { error };
    }
    DeliveryAction::Failed {
        error,
        next_attempt_at_ms: now_ms.saturating_add(backoff_ms(settings, failures)),
    }
}

#[cfg(test)]
mod tests {
    use wire::notify::{DeliveryState, NotifyEvent};

    use super::*;

    fn settings() -> NotifySettings {
        NotifySettings {
            max_attempts: 5,
            backoff_initial_ms: 1_000,
            backoff_max_ms: 6_000,
            ..NotifySettings::default()
        }
    }

    fn delivery(attempts: u32) -> Delivery {
        Delivery {
            id: 3,
            event_id: 42,
            endpoint: "chat".into(),
            event: NotifyEvent::RolloutWaveCompleted {
                rollout_id: "ro_1".into(),
                image: "sentinel:2".into(),
                wave: 2,
                waves: 5,
                succeeded: 4,
                failed: 0,
            },
            created_at_ms: 7,
            state: DeliveryState::Pending,
            revision: 1,
            attempts,
            next_attempt_at_ms: 7,
            last_attempt_at_ms: None,
            last_error: None,
            delivered_at_ms: None,
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let delays: Vec<u64> = (1..=6).map(|n| backoff_ms(&settings(), n)).collect();
        assert_eq!(delays, [1_000, 2_000, 4_000, 6_000, 6_000, 6_000]);
        assert_eq!(backoff_ms(&settings(), u32::MAX), 6_000);
    }

    #[test]
    fn failures_retry_at_the_backoff_until_the_last_attempt() {
        const NOW_MS: u64 = 1_000_000;
        let s = settings();
        assert_eq!(
            decide(&delivery(0), Ok(()), &s, NOW_MS),
            DeliveryAction::Delivered
        );
        for (attempts, wait_ms) in [(0, 1_000), (1, 2_000), (2, 4_000), (3, 6_000)] {
            assert_eq!(
                decide(&delivery(attempts), Err("HTTP 500".into()), &s, NOW_MS),
                DeliveryAction::Failed {
                    error: "HTTP 500".into(),
                    next_attempt_at_ms: NOW_MS + wait_ms,
                },
                "after attempt {}",
                attempts + 1
            );
        }
        assert_eq!(
            decide(&delivery(4), Err("refused".into()), &s, NOW_MS),
            DeliveryAction::GaveUp {
                error: "refused".into()
            },
            "the fifth failure is the last"
        );
        // A replayed delivery starts counting again.
        assert!(matches!(
            decide(&delivery(0), Err("x".into()), &s, NOW_MS),
            DeliveryAction::Failed { .. }
        ));
    }

    #[test]
    fn one_attempt_allowed_gives_up_at_once() {
        let s = NotifySettings {
            max_attempts: 1,
            ..settings()
        };
        assert!(matches!(
            decide(&delivery(0), Err("x".into()), &s, 0),
            DeliveryAction::GaveUp { .. }
        ));
    }

    #[test]
    fn the_body_has_text_kind_id_and_the_fields() {
        let body: serde_json::Value = serde_json::from_slice(&body(&delivery(2))).unwrap();
        assert_eq!(body["event_id"], "42");
        assert_eq!(body["kind"], "rollout.wave_completed");
        assert_eq!(body["data"]["wave"], 2);
        assert_eq!(body["data"]["rollout_id"], "ro_1");
        let text = body["text"].as_str().unwrap();
        assert!(text.contains("wave 2/5 completed"), "{text}");
    }

    #[test]
    fn the_signature_is_the_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        let sig = signature("Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
