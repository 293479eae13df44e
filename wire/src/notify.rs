//! Notifications: the webhook endpoints operators configure, the events a
//! workflow transition announces, and the per-endpoint delivery records
//! the leader works through (at least once, retried with backoff, given up
//! into `dead`, replayable).
//!
//! An event is created in the same apply as the transition it announces
//! and gets a stable id there ([`Delivery::event_id`]), the same on every
//! replica and on every attempt, so a receiver deduplicates by it. What is
//! sent (by the node) is a Slack-compatible `text` plus the event's
//! structured fields.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name;
use crate::model::UnixMs;

/// Most endpoints a cluster keeps (every event goes to each of them).
pub const ENDPOINTS_MAX: usize = 16;
/// Longest endpoint URL.
pub const URL_BYTES_MAX: usize = 2_048;
/// Longest endpoint secret (the HMAC key).
pub const SECRET_BYTES_MAX: usize = 1_024;
/// Longest error text a delivery keeps of a failed attempt.
pub const DELIVERY_ERROR_BYTES_MAX: usize = 512;
/// The HTTP header carrying the event id (the same on every attempt).
pub const EVENT_ID_HEADER: &str = "x-ctrl-event-id";
/// The HTTP header carrying `sha256=<hex HMAC-SHA256 of the body>` when
/// the endpoint has a secret.
pub const SIGNATURE_HEADER: &str = "x-ctrl-signature";

/// A webhook endpoint as stored (with its secret, which never leaves the
/// cluster's state: operators see an [`EndpointView`]; `Debug` shows
/// whether it is set, never the secret).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotifyEndpoint {
    /// Its name, a lowercase DNS label, unique.
    pub name: String,
    /// Where to POST: an `http` or `https` URL with a host.
    pub url: String,
    /// The HMAC-SHA256 key of the signature header; `None`: unsigned.
    pub secret: Option<String>,
    /// When it was added (leader's clock).
    pub created_at_ms: UnixMs,
}

impl NotifyEndpoint {
    /// What operators see of it: everything but the secret.
    pub fn view(&self) -> EndpointView {
        EndpointView {
            name: self.name.clone(),
            url: self.url.clone(),
            secret_set: self.secret.is_some(),
            created_at_ms: self.created_at_ms,
        }
    }
}

/// An endpoint as operators see it: whether a secret is set, never the
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Whether deliveries to it are signed.
    pub secret_set: bool,
    /// When it was added (leader's clock).
    pub created_at_ms: UnixMs,
}

/// `ctrl notify add`: a new endpoint (`Debug` hides the secret).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddEndpoint {
    /// Its name, a lowercase DNS label.
    pub name: String,
    /// An `http` or `https` URL with a host.
    pub url: String,
    /// The signing key, 1 to [`SECRET_BYTES_MAX`] bytes; `None`: unsigned.
    pub secret: Option<String>,
}

impl AddEndpoint {
    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<(), WireError> {
        k8s_name::validate_dns_label("name", &self.name)?;
        validate_url(&self.url)?;
        if let Some(secret) = &self.secret
            && (secret.is_empty() || secret.len() > SECRET_BYTES_MAX)
        {
            return Err(bad_request(format!(
                "secret must be 1 to {SECRET_BYTES_MAX} bytes"
            )));
        }
        Ok(())
    }
}

/// How `Debug` shows a secret: whether it is set.
fn redacted(secret: &Option<String>) -> &'static str {
    if secret.is_some() { "<set>" } else { "<none>" }
}

impl std::fmt::Debug for NotifyEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyEndpoint")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("secret", &redacted(&self.secret))
            .field("created_at_ms", &self.created_at_ms)
            .finish()
    }
}

impl std::fmt::Debug for AddEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddEndpoint")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("secret", &redacted(&self.secret))
            .finish()
    }
}

fn bad_request(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// Checks a webhook URL: `http://` or `https://`, a host (a name, an IPv4
/// address or a bracketed IPv6 one), an optional numeric port, no user
/// info, no whitespace, at most [`URL_BYTES_MAX`] bytes.
pub fn validate_url(url: &str) -> Result<(), WireError> {
    let bad = |why: &str| Err(bad_request(format!("url {url:?} {why}")));
    if url.len() > URL_BYTES_MAX {
        return bad(&format!("is longer than {URL_BYTES_MAX} bytes"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace");
    }
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return bad("must start with http:// or https://");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return bad("must not carry user info");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return bad("has an unclosed IPv6 bracket"),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return bad("has no host");
    }
    let host_ok = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'_'));
    if !host_ok {
        return bad("has a host that is not a name or an address");
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return bad("has a port that is not a number up to 65535");
    }
    Ok(())
}

/// What a notification announces: a workflow transition, with what a
/// receiver wants to know. Variants are append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotifyEvent {
    /// A deployment reached `ready`.
    DeploymentReady {
        /// The deployment.
        deployment_id: String,
        /// Its environment.
        environment_id: String,
        /// Its project.
        project_id: String,
        /// Its image.
        image: String,
        /// Whether it became the environment's live deployment.
        live: bool,
    },
    /// A deployment `failed`.
    DeploymentFailed {
        /// The deployment.
        deployment_id: String,
        /// Its environment.
        environment_id: String,
        /// Its project.
        project_id: String,
        /// Its image.
        image: String,
        /// Why, as the workflow recorded it.
        reason: String,
    },
    /// A fleet rollout started.
    RolloutStarted {
        /// The rollout.
        rollout_id: String,
        /// The image it rolls out.
        image: String,
        /// How many waves it has.
        waves: u32,
        /// How many sentinels it will change.
        sentinels: u32,
    },
    /// A wave of a rollout started.
    RolloutWaveStarted {
        /// The rollout.
        rollout_id: String,
        /// The image it rolls out.
        image: String,
        /// The wave, from 1.
        wave: u32,
        /// How many waves the rollout has.
        waves: u32,
        /// How many sentinels the wave changes.
        sentinels: u32,
    },
    /// A wave of a rollout ended (converged and baked, or with failures).
    RolloutWaveCompleted {
        /// The rollout.
        rollout_id: String,
        /// The image it rolls out.
        image: String,
        /// The wave, from 1.
        wave: u32,
        /// How many waves the rollout has.
        waves: u32,
        /// Sentinels of the wave that converged on the image.
        succeeded: u32,
        /// Sentinels of the wave that failed.
        failed: u32,
    },
    /// A rollout paused: a wave had more failures than allowed.
    RolloutPaused {
        /// The rollout.
        rollout_id: String,
        /// The image it rolls out.
        image: String,
        /// The wave it paused in, from 1.
        wave: u32,
        /// Sentinels that failed in that wave.
        failed: u32,
        /// Why, naming failed sentinels.
        reason: String,
    },
    /// An operator resumed a paused rollout.
    RolloutResumed {
        /// The rollout.
        rollout_id: String,
        /// The image it rolls out.
        image: String,
        /// The wave it resumes with, from 1.
        wave: u32,
    },
    /// A rollout completed: every wave done.
    RolloutCompleted {
        /// The rollout.
        rollout_id: String,
        /// The image it rolled out.
        image: String,
        /// Sentinels now on the image.
        succeeded: u32,
        /// Sentinels that failed (in waves an operator resumed past).
        failed: u32,
    },
    /// An operator started rolling a rollout back.
    RolloutRollbackStarted {
        /// The rollout.
        rollout_id: String,
        /// The image it had rolled out.
        image: String,
        /// Sentinels to revert to their previous image.
        sentinels: u32,
    },
    /// A rollback ended (the rollout is then cancelled).
    RolloutRollbackCompleted {
        /// The rollout.
        rollout_id: String,
        /// The image it had rolled out.
        image: String,
        /// Sentinels reverted to their previous image.
        reverted: u32,
        /// Sentinels that could not be reverted.
        failed: u32,
    },
}

impl NotifyEvent {
    /// The event's kind, stable, as receivers filter on it
    /// (`deployment.ready`, `rollout.wave_started`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            NotifyEvent::DeploymentReady { .. } => "deployment.ready",
            NotifyEvent::DeploymentFailed { .. } => "deployment.failed",
            NotifyEvent::RolloutStarted { .. } => "rollout.started",
            NotifyEvent::RolloutWaveStarted { .. } => "rollout.wave_started",
            NotifyEvent::RolloutWaveCompleted { .. } => "rollout.wave_completed",
            NotifyEvent::RolloutPaused { .. } => "rollout.paused",
            NotifyEvent::RolloutResumed { .. } => "rollout.resumed",
            NotifyEvent::RolloutCompleted { .. } => "rollout.completed",
            NotifyEvent::RolloutRollbackStarted { .. } => "rollout.rollback_started",
            NotifyEvent::RolloutRollbackCompleted { .. } => "rollout.rollback_completed",
        }
    }

    /// One line a chat channel shows.
    pub fn text(&self) -> String {
        match self {
            NotifyEvent::DeploymentReady {
                deployment_id,
                environment_id,
                image,
                live,
                ..
            } => {
                let live = if *live { " and live" } else { "" };
                format!("Deployment {deployment_id} of {environment_id} is ready{live} ({image})")
            }
            NotifyEvent::DeploymentFailed {
                deployment_id,
                environment_id,
                image,
                reason,
                ..
            } => {
                format!("Deployment {deployment_id} of {environment_id} failed ({image}): {reason}")
            }
            NotifyEvent::RolloutStarted {
                rollout_id,
                image,
                waves,
                sentinels,
            } => format!(
                "Rollout {rollout_id} of {image} started: {sentinels} sentinels in {waves} waves"
            ),
            NotifyEvent::RolloutWaveStarted {
                rollout_id,
                image,
                wave,
                waves,
                sentinels,
            } => format!(
                "Rollout {rollout_id} of {image}: wave {wave}/{waves} started ({sentinels} sentinels)"
            ),
            NotifyEvent::RolloutWaveCompleted {
                rollout_id,
                image,
                wave,
                waves,
                succeeded,
                failed,
            } => format!(
                "Rollout {rollout_id} of {image}: wave {wave}/{waves} completed \
                 ({succeeded} succeeded, {failed} failed)"
            ),
            NotifyEvent::RolloutPaused {
                rollout_id,
                image,
                wave,
                failed,
                reason,
            } => format!(
                "Rollout {rollout_id} of {image} paused in wave {wave} ({failed} failed): {reason}"
            ),
            NotifyEvent::RolloutResumed {
                rollout_id,
                image,
                wave,
            } => format!("Rollout {rollout_id} of {image} resumed at wave {wave}"),
            NotifyEvent::RolloutCompleted {
                rollout_id,
                image,
                succeeded,
                failed,
            } => format!(
                "Rollout {rollout_id} of {image} completed ({succeeded} succeeded, {failed} failed)"
            ),
            NotifyEvent::RolloutRollbackStarted {
                rollout_id,
                image,
                sentinels,
            } => format!("Rollout {rollout_id} of {image}: rolling back {sentinels} sentinels"),
            NotifyEvent::RolloutRollbackCompleted {
                rollout_id,
                image,
                reverted,
                failed,
            } => format!(
                "Rollout {rollout_id} of {image}: rollback completed \
                 ({reverted} reverted, {failed} failed)"
            ),
        }
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryState {
    /// Not delivered yet: due at [`Delivery::next_attempt_at_ms`].
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Given up after the node's most attempts, or its endpoint was
    /// removed; `ctrl notify replay` makes it pending again.
    Dead,
}

impl DeliveryState {
    /// The state's stable name (the step of the delivery's guard).
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }
}

/// One event to one endpoint: what the leader's delivery job works
/// through, each attempt's result recorded by a guarded write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The delivery's id (gap-free, from 1; `ctrl notify replay ID`).
    pub id: u64,
    /// The event's id: the same for every endpoint and every attempt.
    pub event_id: u64,
    /// The endpoint, by name.
    pub endpoint: String,
    /// What it announces.
    pub event: NotifyEvent,
    /// When the event was created (leader's clock).
    pub created_at_ms: UnixMs,
    /// Where it stands.
    pub state: DeliveryState,
    /// Raised by every write of the record (with the state, its guard).
    pub revision: u64,
    /// Attempts made since it was created or last replayed.
    pub attempts: u32,
    /// When the next attempt is due (pending only).
    pub next_attempt_at_ms: UnixMs,
    /// When the last attempt was recorded.
    pub last_attempt_at_ms: Option<UnixMs>,
    /// What the last failed attempt got (bounded by
    /// [`DELIVERY_ERROR_BYTES_MAX`]).
    pub last_error: Option<String>,
    /// When it was delivered.
    pub delivered_at_ms: Option<UnixMs>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_a_scheme_and_a_host() {
        for good in [
            "http://hooks.example.com/services/T0/B0",
            "https://10.0.0.5:8443/hook?x=1",
            "http://[::1]:9000/",
            "http://localhost",
        ] {
            validate_url(good).unwrap_or_else(|e| panic!("{good}: {e:?}"));
        }
        for (bad, says) in [
            ("ftp://x/", "http:// or https://"),
            ("https:///path", "no host"),
            ("http://:80/", "no host"),
            ("http://user:pw@host/", "user info"),
            ("http://host:99999/", "port"),
            ("http://ho st/", "whitespace"),
            ("http://[::1/", "bracket"),
            ("http://h%41/", "not a name"),
        ] {
            let e = validate_url(bad).unwrap_err();
            assert!(e.message.contains(says), "{bad}: {}", e.message);
        }
        let long = format!("http://h/{}", "a".repeat(URL_BYTES_MAX));
        assert!(validate_url(&long).unwrap_err().message.contains("longer"));
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let request = AddEndpoint {
            name: "chat".into(),
            url: "https://chat.example/".into(),
            secret: Some("s3cret".into()),
        };
        let shown = format!("{request:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<set>"),
            "{shown}"
        );
        let stored = NotifyEndpoint {
            name: "chat".into(),
            url: "https://chat.example/".into(),
            secret: Some("s3cret".into()),
            created_at_ms: 1,
        };
        assert!(!format!("{stored:?}").contains("s3cret"));
    }

    #[test]
    fn an_endpoint_request_names_the_bad_field() {
        let good = AddEndpoint {
            name: "chat".into(),
            url: "https://chat.example/hooks/1".into(),
            secret: Some("s3cret".into()),
        };
        good.validate().unwrap();
        let mut bad = good.clone();
        bad.name = "Chat".into();
        assert!(bad.validate().unwrap_err().message.contains("name"));
        let mut bad = good.clone();
        bad.secret = Some(String::new());
        assert!(bad.validate().unwrap_err().message.contains("secret"));
    }
}
