//! The workload flags of `ctrl deploy` (port, command, health check,
//! shutdown, pod labels and annotations, secret environment) and the
//! health flags `ctrl update` shares. Values are checked by the request's
//! validation on the node (errors name the field); here they are only
//! parsed. Secret values are read from files, never from the command
//! line (which `ps` and shell histories show).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use wire::workload::{
    HealthCheck, PROBE_FAILURE_THRESHOLD_DEFAULT, PROBE_PERIOD_S_DEFAULT, PROBE_TIMEOUT_S_DEFAULT,
    Probe, SECRET_VALUE_BYTES_MAX, SecretValue, WorkloadSpec,
};

/// Largest `--secret-env-file` read, in bytes.
pub(crate) const SECRET_ENV_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The health check flags.
#[derive(Debug, Args, Default)]
pub(crate) struct HealthArgs {
    /// Health check: an HTTP GET of PATH (on PORT, else on --port);
    /// becomes the readiness and liveness probes.
    #[arg(long, value_name = "PATH[:PORT]", conflicts_with = "health_exec")]
    pub health_http: Option<String>,
    /// Health check: a command run in the container (split at
    /// whitespace; `sh -c '…'` for anything a shell must read); healthy
    /// when it exits 0.
    #[arg(long, value_name = "CMD")]
    pub health_exec: Option<String>,
    /// Seconds between health probes.
    #[arg(long, default_value_t = PROBE_PERIOD_S_DEFAULT)]
    pub health_period_s: u32,
    /// Seconds a health probe may take.
    #[arg(long, default_value_t = PROBE_TIMEOUT_S_DEFAULT)]
    pub health_timeout_s: u32,
    /// Failed probes in a row before unready (readiness) or a restart
    /// (liveness).
    #[arg(long, default_value_t = PROBE_FAILURE_THRESHOLD_DEFAULT)]
    pub health_failure_threshold: u32,
}

impl HealthArgs {
    /// The health check the flags ask for, if any.
    pub(crate) fn health(&self) -> Result<Option<HealthCheck>> {
        let probe = match (&self.health_http, &self.health_exec) {
            (Some(spec), _) => Some(parse_http(spec)?),
            (None, Some(command)) => Some(Probe::Exec {
                command: command.split_whitespace().map(str::to_string).collect(),
            }),
            (None, None) => None,
        };
        Ok(probe.map(|probe| HealthCheck {
            probe,
            period_s: self.health_period_s,
            timeout_s: self.health_timeout_s,
            failure_threshold: self.health_failure_threshold,
        }))
    }
}

fn parse_http(spec: &str) -> Result<Probe> {
    // PATH[:PORT]: a port is the digits after the last ':'.
    match spec.rsplit_once(':') {
        Some((path, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            let port: u16 = port
                .parse()
                .with_context(|| format!("--health-http {spec:?}: port {port} is not 1-65535"))?;
            Ok(Probe::Http {
                path: path.to_string(),
                port: Some(port),
            })
        }
        _ => Ok(Probe::Http {
            path: spec.to_string(),
            port: None,
        }),
    }
}

/// The workload flags of `ctrl deploy`.
#[derive(Debug, Args)]
pub(crate) struct SpecArgs {
    /// The port the application listens on (container port and the
    /// headless Service's port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Replace the image's entrypoint: one entry per flag, repeatable.
    #[arg(long = "command", value_name = "ENTRY", allow_hyphen_values = true)]
    pub command: Vec<String>,
    /// Replace the image's arguments: one entry per flag, repeatable.
    #[arg(long = "args", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    #[command(flatten)]
    pub health: HealthArgs,
    /// The signal that asks the container to stop (e.g. SIGQUIT; QUIT
    /// works too), set as the container's `lifecycle.stopSignal`.
    #[arg(long, value_name = "SIGNAL")]
    pub shutdown_signal: Option<String>,
    /// Seconds between the stop signal and a kill.
    #[arg(long)]
    pub termination_grace_s: Option<u32>,
    /// A pod label, KEY=VALUE, repeatable (krane's own keys are refused).
    #[arg(long = "label", value_parser = parse_pair)]
    pub labels: Vec<(String, String)>,
    /// A pod annotation, KEY=VALUE, repeatable.
    #[arg(long = "annotation", value_parser = parse_pair)]
    pub annotations: Vec<(String, String)>,
    /// A secret environment variable, NAME=@FILE: the value is FILE's
    /// contents, as they are. Repeatable.
    #[arg(long = "secret-env", value_name = "NAME=@FILE")]
    pub secret_env: Vec<String>,
    /// A file of secret environment variables, one NAME=VALUE a line
    /// (`#` comments and blank lines skipped). Repeatable.
    #[arg(long = "secret-env-file", value_name = "FILE")]
    pub secret_env_files: Vec<PathBuf>,
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

impl SpecArgs {
    /// The spec the flags describe, secret files read.
    pub(crate) fn spec(self) -> Result<WorkloadSpec> {
        let mut secret_env = BTreeMap::new();
        for file in &self.secret_env_files {
            for (name, value) in read_env_file(file)? {
                insert_secret(&mut secret_env, name, value)?;
            }
        }
        for item in &self.secret_env {
            let Some((name, file)) = item.split_once("=@") else {
                bail!("--secret-env {:?} is not NAME=@FILE", short(item));
            };
            insert_secret(
                &mut secret_env,
                name.to_string(),
                read_secret(Path::new(file))?,
            )?;
        }
        Ok(WorkloadSpec {
            port: self.port,
            command: self.command,
            args: self.args,
            health: self.health.health()?,
            shutdown_signal: self.shutdown_signal.map(|s| signal_name(&s)),
            termination_grace_s: self.termination_grace_s,
            pod_labels: self.labels.into_iter().collect(),
            pod_annotations: self.annotations.into_iter().collect(),
            secret_env,
        })
    }
}

/// `QUIT`, `quit`, `SIGQUIT` → `SIGQUIT`.
fn signal_name(text: &str) -> String {
    let upper = text.trim().to_ascii_uppercase();
    if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    }
}

/// At most a few characters of what was typed: never echo a value that
/// may be a secret pasted in the wrong place.
fn short(text: &str) -> String {
    let name = text.split('=').next().unwrap_or("");
    format!("{name}=…")
}

fn insert_secret(
    secrets: &mut BTreeMap<String, SecretValue>,
    name: String,
    value: String,
) -> Result<()> {
    if secrets
        .insert(name.clone(), SecretValue::Plain(value))
        .is_some()
    {
        bail!("secret env {name} is given twice");
    }
    Ok(())
}

fn read_bounded(path: &Path, max: u64) -> Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len > max {
        bail!("{} is larger than {max} bytes", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn read_secret(path: &Path) -> Result<String> {
    read_bounded(
        path,
        u64::try_from(SECRET_VALUE_BYTES_MAX).unwrap_or(u64::MAX),
    )
}

fn read_env_file(path: &Path) -> Result<Vec<(String, String)>> {
    let text = read_bounded(path, SECRET_ENV_FILE_BYTES_MAX)?;
    let mut pairs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            // The line may hold a value: name only its number.
            bail!("{} line {}: not NAME=VALUE", path.display(), n + 1);
        };
        pairs.push((name.trim().to_string(), value.to_string()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_http_takes_an_optional_port() {
        assert_eq!(
            parse_http("/healthz").unwrap(),
            Probe::Http {
                path: "/healthz".into(),
                port: None
            }
        );
        assert_eq!(
            parse_http("/ready:9090").unwrap(),
            Probe::Http {
                path: "/ready".into(),
                port: Some(9090)
            }
        );
        assert!(parse_http("/x:70000").is_err());
    }

    #[test]
    fn signals_are_named_as_kubernetes_names_them() {
        assert_eq!(signal_name("quit"), "SIGQUIT");
        assert_eq!(signal_name("SIGTERM"), "SIGTERM");
    }

    #[test]
    fn secrets_come_from_files_and_errors_never_show_values() {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("db");
        std::fs::write(&one, "postgres://u:p@db/x").unwrap();
        let pairs = dir.path().join("pairs.env");
        std::fs::write(&pairs, "# comment\n\nAPI_KEY=abc=def\nTOKEN= t \n").unwrap();
        let args = SpecArgs {
            port: None,
            command: vec![],
            args: vec![],
            health: HealthArgs::default(),
            shutdown_signal: None,
            termination_grace_s: None,
            labels: vec![],
            annotations: vec![],
            secret_env: vec![format!("DB=@{}", one.display())],
            secret_env_files: vec![pairs.clone()],
        };
        let spec = args.spec().unwrap();
        let plain = |name: &str| match &spec.secret_env[name] {
            SecretValue::Plain(v) => v.clone(),
            SecretValue::Sealed(_) => panic!("sealed"),
        };
        assert_eq!(plain("DB"), "postgres://u:p@db/x");
        assert_eq!(plain("API_KEY"), "abc=def");
        assert_eq!(plain("TOKEN"), " t ");
        let bad = dir.path().join("bad.env");
        std::fs::write(&bad, "hunter2\n").unwrap();
        let e = read_env_file(&bad).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("hunter2"), "{e}");
        let e = SpecArgs {
            secret_env: vec!["DB=hunter2".into()],
            secret_env_files: vec![],
            ..args_without_secrets()
        }
        .spec()
        .unwrap_err()
        .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    fn args_without_secrets() -> SpecArgs {
        SpecArgs {
            port: None,
            command: vec![],
            args: vec![],
            health: HealthArgs::default(),
            shutdown_signal: None,
            termination_grace_s: None,
            labels: vec![],
            annotations: vec![],
            secret_env: vec![],
            secret_env_files: vec![],
        }
    }
}
