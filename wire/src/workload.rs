//! The workload settings of a deployment beyond its image and size: the
//! port it listens on, its command, its health check (krane's readiness
//! and liveness probes), how it shuts down, extra pod labels and
//! annotations, and secret environment variables.
//!
//! Every field is optional; a [`WorkloadSpec::default`] builds the pods
//! as before these settings existed. [`WorkloadSpec::validate`] applies
//! the rules Kubernetes applies to the objects krane builds, so a spec
//! that passes it is not refused by the API server; errors name the field.
//!
//! Secret values travel as [`SecretValue`]: `Plain` from the operator to
//! a node and from a node to the agent of a target region (both over
//! mutual TLS), `Sealed` everywhere they are stored (state, Raft log,
//! snapshots). Neither variant's `Debug` shows a value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::k8s_name::DNS_SUBDOMAIN_BYTES_MAX;

/// Most entries of `command` or of `args`.
pub const COMMAND_ARGS_MAX: usize = 64;
/// Longest entry of `command`, `args` or an exec probe's command.
pub const COMMAND_ARG_BYTES_MAX: usize = 4_096;
/// Longest HTTP probe path.
pub const PROBE_PATH_BYTES_MAX: usize = 1_024;
/// Longest probe period or timeout, in seconds.
pub const PROBE_SECONDS_MAX: u32 = 3_600;
/// Highest probe failure threshold.
pub const PROBE_FAILURE_THRESHOLD_MAX: u32 = 100;
/// Probe period when none is given, in seconds (Kubernetes' default).
pub const PROBE_PERIOD_S_DEFAULT: u32 = 10;
/// Probe timeout when none is given, in seconds (Kubernetes' default).
pub const PROBE_TIMEOUT_S_DEFAULT: u32 = 1;
/// Probe failure threshold when none is given (Kubernetes' default).
pub const PROBE_FAILURE_THRESHOLD_DEFAULT: u32 = 3;
/// Longest termination grace period, in seconds.
pub const TERMINATION_GRACE_S_MAX: u32 = 86_400;
/// Most pod labels, and most pod annotations, of one deployment.
pub const POD_METADATA_MAX: usize = 64;
/// Longest label value Kubernetes accepts.
pub const LABEL_VALUE_BYTES_MAX: usize = 63;
/// Longest name part of a label or annotation key.
pub const QUALIFIED_NAME_BYTES_MAX: usize = 63;
/// Most bytes of all pod annotations together (keys and values).
pub const ANNOTATIONS_BYTES_MAX: usize = 64 * 1024;
/// Most secret environment variables of one deployment.
pub const SECRET_ENV_MAX: usize = 64;
/// Longest secret value, in bytes.
pub const SECRET_VALUE_BYTES_MAX: usize = 32 * 1024;
/// Longest key id of a sealed value.
pub const KEY_ID_BYTES_MAX: usize = 64;
/// The nonce length of a sealed value (AES-256-GCM's 96 bits).
pub const SEALED_NONCE_BYTES: usize = 12;
/// Longest ciphertext of a sealed value (the value and its 16-byte tag).
pub const SEALED_CIPHERTEXT_BYTES_MAX: usize = SECRET_VALUE_BYTES_MAX + 16;

/// Label keys krane sets itself on every object: a pod label may not
/// use these prefixes (or be one of these keys).
pub const RESERVED_LABEL_PREFIXES: [&str; 2] = ["unkey.com/", "app.kubernetes.io/"];

/// The stop signals `shutdown_signal` accepts (the Linux names Kubernetes'
/// `lifecycle.stopSignal` accepts, without the real-time ones).
pub const STOP_SIGNALS: [&str; 31] = [
    "SIGABRT",
    "SIGALRM",
    "SIGBUS",
    "SIGCHLD",
    "SIGCLD",
    "SIGCONT",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGIO",
    "SIGIOT",
    "SIGKILL",
    "SIGPIPE",
    "SIGPOLL",
    "SIGPROF",
    "SIGPWR",
    "SIGQUIT",
    "SIGSEGV",
    "SIGSTKFLT",
    "SIGSTOP",
    "SIGSYS",
    "SIGTERM",
    "SIGTRAP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGUSR1",
    "SIGUSR2",
    "SIGWINCH",
];

/// What a deployment's pods run beyond image and size. The default is
/// the workload as it was before these settings: no port, the image's
/// entrypoint, no probes, the runtime's stop signal and Kubernetes'
/// grace period, krane's labels only, no secrets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// The port the application listens on (the container port, and the
    /// port of the headless Service).
    pub port: Option<u16>,
    /// Replaces the image's entrypoint (`command`); empty: the image's.
    pub command: Vec<String>,
    /// Replaces the image's arguments (`args`); empty: the image's.
    pub args: Vec<String>,
    /// How to tell the application is healthy: the pods' readiness and
    /// liveness probes.
    pub health: Option<HealthCheck>,
    /// The signal that asks the container to stop (`lifecycle.stopSignal`,
    /// one of [`STOP_SIGNALS`]); `None`: the runtime's (the image's
    /// `STOPSIGNAL`, else `SIGTERM`).
    pub shutdown_signal: Option<String>,
    /// Seconds between the stop signal and a kill
    /// (`terminationGracePeriodSeconds`); `None`: Kubernetes' 30.
    pub termination_grace_s: Option<u32>,
    /// Extra labels of the pods (never one of krane's own).
    pub pod_labels: BTreeMap<String, String>,
    /// Annotations of the pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// Environment variables delivered through a Kubernetes Secret.
    pub secret_env: BTreeMap<String, SecretValue>,
}

/// A health check: one probe, used for readiness (whether the instance
/// counts as running) and liveness (whether Kubernetes restarts it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// What to probe.
    pub probe: Probe,
    /// Seconds between probes (1 to [`PROBE_SECONDS_MAX`]).
    pub period_s: u32,
    /// Seconds a probe may take (1 to [`PROBE_SECONDS_MAX`]).
    pub timeout_s: u32,
    /// Failures in a row before unready, or before a restart (1 to
    /// [`PROBE_FAILURE_THRESHOLD_MAX`]).
    pub failure_threshold: u32,
}

impl HealthCheck {
    /// A check of `probe` with Kubernetes' default period, timeout and
    /// threshold.
    pub fn new(probe: Probe) -> HealthCheck {
        HealthCheck {
            probe,
            period_s: PROBE_PERIOD_S_DEFAULT,
            timeout_s: PROBE_TIMEOUT_S_DEFAULT,
            failure_threshold: PROBE_FAILURE_THRESHOLD_DEFAULT,
        }
    }
}

/// What a health check probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// An HTTP GET of `path`; healthy on a 2xx or 3xx answer.
    Http {
        /// The path, starting with `/`.
        path: String,
        /// The port; `None`: the spec's `port` (which must then be set).
        port: Option<u16>,
    },
    /// A command run in the container; healthy when it exits 0.
    Exec {
        /// The command and its arguments (no shell unless it names one).
        command: Vec<String>,
    },
}

/// A secret environment variable's value.
///
/// In a human-readable format (the CLI's JSON) it serializes as a
/// placeholder, never as its value or ciphertext: `"<redacted>"` or
/// `"<sealed by KEY_ID>"`. Binary formats (postcard) carry it whole.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub enum SecretValue {
    /// The value in the clear: only from an operator to a node and from a
    /// node to an agent, never stored by ctrl.
    Plain(String),
    /// The value encrypted by the nodes' key, as stored.
    Sealed(SealedSecret),
}

/// The postcard shape of [`SecretValue`] (the derived one).
#[derive(Serialize)]
#[serde(rename = "SecretValue")]
enum SecretValueRepr<'a> {
    Plain(&'a str),
    Sealed(&'a SealedSecret),
}

impl Serialize for SecretValue {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return match self {
                SecretValue::Plain(_) => serializer.serialize_str("<redacted>"),
                SecretValue::Sealed(sealed) => {
                    serializer.serialize_str(&format!("<sealed by {}>", sealed.key_id))
                }
            };
        }
        match self {
            SecretValue::Plain(text) => SecretValueRepr::Plain(text),
            SecretValue::Sealed(sealed) => SecretValueRepr::Sealed(sealed),
        }
        .serialize(serializer)
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretValue::Plain(_) => f.write_str("Plain(<redacted>)"),
            SecretValue::Sealed(sealed) => f.debug_tuple("Sealed").field(sealed).finish(),
        }
    }
}

/// A value encrypted with AEAD (AES-256-GCM) by one of the nodes' keys,
/// with the deployment id and the variable's name as associated data.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecret {
    /// Which key sealed it (keys are rotated; old ones still open).
    pub key_id: String,
    /// The random nonce, [`SEALED_NONCE_BYTES`] bytes.
    pub nonce: Vec<u8>,
    /// The ciphertext with its tag.
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSecret")
            .field("key_id", &self.key_id)
            .field("ciphertext_bytes", &self.ciphertext.len())
            .finish_non_exhaustive()
    }
}

impl WorkloadSpec {
    /// Whether every secret value is sealed (as ctrl stores them).
    pub fn secrets_sealed(&self) -> bool {
        self.secret_env
            .values()
            .all(|v| matches!(v, SecretValue::Sealed(_)))
    }

    /// Checks every field as Kubernetes would check the objects built
    /// from it; `env_vars` are the deployment's plain variables (a secret
    /// may not share a name with one). The error names the field.
    pub fn validate(&self, env_vars: &BTreeMap<String, String>) -> Result<(), WireError> {
        if self.port == Some(0) {
            return bad("port must be between 1 and 65535".into());
        }
        check_strings("command", &self.command)?;
        check_strings("args", &self.args)?;
        if let Some(health) = &self.health {
            self.check_health(health)?;
        }
        if let Some(signal) = &self.shutdown_signal
            && !STOP_SIGNALS.contains(&signal.as_str())
        {
            return bad(format!(
                "shutdown_signal {signal:?} is not a signal name Kubernetes accepts (e.g. SIGTERM, SIGQUIT, SIGINT)"
            ));
        }
        if let Some(grace) = self.termination_grace_s
            && grace > TERMINATION_GRACE_S_MAX
        {
            return bad(format!(
                "termination_grace_s must be at most {TERMINATION_GRACE_S_MAX}"
            ));
        }
        check_pod_labels(&self.pod_labels)?;
        check_pod_annotations(&self.pod_annotations)?;
        self.check_secrets(env_vars)
    }

    fn check_health(&self, health: &HealthCheck) -> Result<(), WireError> {
        match &health.probe {
            Probe::Http { path, port } => {
                if !path.starts_with('/')
                    || path.len() > PROBE_PATH_BYTES_MAX
                    || path.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return bad(format!(
                        "health.path {path:?} must start with '/', hold no whitespace and be at most {PROBE_PATH_BYTES_MAX} bytes"
                    ));
                }
                match (port, self.port) {
                    (Some(0), _) => {
                        return bad("health.port must be between 1 and 65535".into());
                    }
                    (None, None) => {
                        return bad(
                            "health.port is needed: an HTTP health check names a port (PATH:PORT) when the deployment has no port".into(),
                        );
                    }
                    _ => {}
                }
            }
            Probe::Exec { command } => {
                if command.is_empty() {
                    return bad("health.command must not be empty".into());
                }
                check_strings("health.command", command)?;
            }
        }
        for (field, value, max) in [
            ("health.period_s", health.period_s, PROBE_SECONDS_MAX),
            ("health.timeout_s", health.timeout_s, PROBE_SECONDS_MAX),
            (
                "health.failure_threshold",
                health.failure_threshold,
                PROBE_FAILURE_THRESHOLD_MAX,
            ),
        ] {
            if value == 0 || value > max {
                return bad(format!("{field} must be between 1 and {max}"));
            }
        }
        Ok(())
    }

    fn check_secrets(&self, env_vars: &BTreeMap<String, String>) -> Result<(), WireError> {
        if self.secret_env.len() > SECRET_ENV_MAX {
            return bad(format!(
                "secret_env holds more than {SECRET_ENV_MAX} variables"
            ));
        }
        for (name, value) in &self.secret_env {
            // The name is also the key in the Kubernetes Secret.
            if name.is_empty()
                || name.len() > DNS_SUBDOMAIN_BYTES_MAX
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            {
                return bad(format!(
                    "secret_env name {name:?} must be 1 to {DNS_SUBDOMAIN_BYTES_MAX} of [-._a-zA-Z0-9]"
                ));
            }
            if env_vars.contains_key(name) {
                return bad(format!(
                    "secret_env {name} is also a plain env var; a name may be one or the other"
                ));
            }
            match value {
                SecretValue::Plain(text) if text.len() > SECRET_VALUE_BYTES_MAX => {
                    return bad(format!(
                        "secret_env {name} is longer than {SECRET_VALUE_BYTES_MAX} bytes"
                    ));
                }
                SecretValue::Sealed(sealed)
                    if sealed.key_id.is_empty()
                        || sealed.key_id.len() > KEY_ID_BYTES_MAX
                        || sealed.nonce.len() != SEALED_NONCE_BYTES
                        || sealed.ciphertext.len() > SEALED_CIPHERTEXT_BYTES_MAX =>
                {
                    return bad(format!(
                        "secret_env {name} is not a well-formed sealed value"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn bad(message: String) -> Result<(), WireError> {
    Err(WireError::new(ErrorCode::BadRequest, message))
}

fn check_strings(field: &str, values: &[String]) -> Result<(), WireError> {
    if values.len() > COMMAND_ARGS_MAX {
        return bad(format!(
            "{field} holds more than {COMMAND_ARGS_MAX} entries"
        ));
    }
    if values.iter().any(|v| v.len() > COMMAND_ARG_BYTES_MAX) {
        return bad(format!(
            "an entry of {field} is longer than {COMMAND_ARG_BYTES_MAX} bytes"
        ));
    }
    Ok(())
}

/// Whether `value` is a Kubernetes "name" part: 1 to 63 of
/// `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
fn is_name_part(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= QUALIFIED_NAME_BYTES_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Checks a label or annotation key as Kubernetes does: an optional DNS
/// subdomain prefix and `/`, then a name part.
fn check_qualified_name(field: &str, key: &str) -> Result<(), WireError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix
        .is_none_or(|p| crate::k8s_name::validate_dns_subdomain(field, p).is_ok() && !p.is_empty());
    if prefix_ok && is_name_part(name) {
        Ok(())
    } else {
        bad(format!(
            "{field} key {key:?} is not a qualified name ([prefix/]name: name 1 to {QUALIFIED_NAME_BYTES_MAX} of [A-Za-z0-9_.-], alphanumeric at both ends; prefix a DNS subdomain)"
        ))
    }
}

fn check_pod_labels(labels: &BTreeMap<String, String>) -> Result<(), WireError> {
    if labels.len() > POD_METADATA_MAX {
        return bad(format!(
            "pod_labels holds more than {POD_METADATA_MAX} labels"
        ));
    }
    for (key, value) in labels {
        check_qualified_name("pod_labels", key)?;
        if RESERVED_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)) {
            return bad(format!(
                "pod_labels key {key:?} is krane's own (prefixes {})",
                RESERVED_LABEL_PREFIXES.join(", ")
            ));
        }
        if !value.is_empty() && !is_name_part(value) {
            return bad(format!(
                "pod_labels value {value:?} of {key} must be empty or 1 to {LABEL_VALUE_BYTES_MAX} of [A-Za-z0-9_.-], alphanumeric at both ends"
            ));
        }
    }
    Ok(())
}

fn check_pod_annotations(annotations: &BTreeMap<String, String>) -> Result<(), WireError> {
    if annotations.len() > POD_METADATA_MAX {
        return bad(format!(
            "pod_annotations holds more than {POD_METADATA_MAX} annotations"
        ));
    }
    let mut bytes = 0usize;
    for (key, value) in annotations {
        check_qualified_name("pod_annotations", key)?;
        bytes = bytes.saturating_add(key.len()).saturating_add(value.len());
    }
    if bytes > ANNOTATIONS_BYTES_MAX {
        return bad(format!(
            "pod_annotations are larger than {ANNOTATIONS_BYTES_MAX} bytes together"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
