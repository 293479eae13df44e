//! `ctrl certs`: a CA and node, operator and agent certificates, for sites
//! without an ACME service; and the nodes' secrets key file (written by
//! `init`, rotated by `rotate-secrets-key`). `check` lists every
//! certificate of a directory with its expiry ([`CheckLine`], the `-o json`
//! shape); `renew` issues fresh leaves in place (nodes and krane reload
//! them); `rotate-ca` and `drop-old-ca` begin and end a CA rotation.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Subcommand;
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use transport::expiry::{self, CertInfo, CertKind, ExpiryStatus};
use transport::renew::{self, RenewSelection};
use wire::operator::request::{ListEnvironments, ListRevocations, RevokeCertificate};
use wire::revocation::{Revocation, RevokedTarget, normalize_serial};

use super::Output;

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a CA and certificates for the given nodes and regions.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// The ids of the nodes to issue certificates for, comma-separated
        /// (`1,2,3` for a three-node cluster).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1",
            value_name = "ID,..."
        )]
        node_ids: Vec<u64>,
        /// Regions to issue agent certificates for.
        #[arg(long, value_delimiter = ',', default_value = "us-east,eu-west")]
        regions: Vec<String>,
        /// DNS names the node certificates carry besides 127.0.0.1 and ::1
        /// (for other tools: ctrl itself checks a node's identity, not its
        /// names).
        #[arg(long, value_delimiter = ',', default_value = "ctrl.local,localhost")]
        server_names: Vec<String>,
    },
    /// Issue a node certificate for one more node with an existing CA (for
    /// `ctrl cluster add-node`).
    AddNode {
        #[arg(long)]
        dir: PathBuf,
        /// The new node's id.
        #[arg(long)]
        id: u64,
        /// DNS names the certificate carries.
        #[arg(long, value_delimiter = ',', default_value = "ctrl.local,localhost")]
        server_names: Vec<String>,
    },
    /// Issue an agent certificate for one more region with an existing CA.
    AddAgent {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        region: String,
    },
    /// Issue a certificate for a named operator (`operator-NAME.pem/.key`)
    /// with a role and an environment scope, with an existing CA. The
    /// role: `viewer` (every read), `deployer` (reads, and deploy, stop,
    /// start, archive, cancel, rollback and update inside its scope) or
    /// `admin` (everything). The certificate `operator.pem` of `init`
    /// (`ctrl://operator`) is an admin named `operator`.
    AddOperator {
        #[arg(long)]
        dir: PathBuf,
        /// Who it is for (lowercase letters, digits, `-`, `_`, `.`).
        #[arg(long)]
        name: String,
        /// viewer, deployer or admin.
        #[arg(long)]
        role: String,
        /// Environment patterns a deployer may act in, comma-separated
        /// (`*` is any run of characters); every environment if omitted.
        #[arg(long, value_delimiter = ',', value_name = "PATTERN,...")]
        environments: Vec<String>,
    },
    /// List every certificate in a directory (CA, nodes, operator, agents)
    /// with its expiry; exits non-zero when one has expired or a file does
    /// not read.
    Check {
        #[arg(long)]
        dir: PathBuf,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Issue fresh certificates (new keys) from the CA in the directory for
    /// the identities and names the current ones carry, replacing the files
    /// atomically. Running nodes and krane pick them up within their
    /// `tls.reload_interval_ms`. No selection: every node, operator and
    /// agent certificate in the directory.
    Renew {
        #[arg(long)]
        dir: PathBuf,
        /// Node ids, comma-separated.
        #[arg(long, value_delimiter = ',', value_name = "ID,...")]
        nodes: Vec<u64>,
        /// Agent regions, comma-separated.
        #[arg(long, value_delimiter = ',', value_name = "REGION,...")]
        agents: Vec<String>,
        /// The operator certificate (`operator.pem`).
        #[arg(long)]
        operator: bool,
        /// Named operators (`operator-NAME.pem`), comma-separated.
        #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
        operators: Vec<String>,
        /// Validity in days (never past the CA's own expiry).
        #[arg(long, default_value_t = renew::RENEW_DEFAULT_DAYS)]
        days: u64,
    },
    /// Begin a CA rotation: add a new CA to `ca.pem` (old and new are then
    /// both trusted) and sign with it from now on (`ca.key` is the new key;
    /// the old one is kept beside it). See README, "Rotating the CA".
    RotateCa {
        #[arg(long)]
        dir: PathBuf,
    },
    /// End a CA rotation: `ca.pem` keeps only the CA of `ca.key`. Only
    /// once every leaf is renewed under the new CA.
    DropOldCa {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Revoke, in the running cluster, one certificate (`--serial`, as
    /// `certs check -o json` shows it) or every certificate of an
    /// operator or of a region's agent issued up to now (a replacement
    /// issued afterwards is accepted). Every node refuses it from its next
    /// request and closes its open connections. Node certificates are
    /// withdrawn by a CA rotation instead. Needs an admin's certificate.
    Revoke {
        /// The serial number (hex; `:` separators and a `0x` prefix are
        /// accepted).
        #[arg(long, group = "target", required = true)]
        serial: Option<String>,
        /// An operator's name (`operator` for the unnamed certificates of
        /// `init`).
        #[arg(long, group = "target", value_name = "NAME")]
        operator: Option<String>,
        /// A region, for its agent's certificates.
        #[arg(long, group = "target", value_name = "REGION")]
        agent: Option<String>,
        /// Why (kept with the revocation and told to the refused peer).
        #[arg(long)]
        reason: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// List the revocations of the running cluster.
    Revoked {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Put a new key on top of the nodes' secrets key file (`secrets_key`):
    /// it seals new secret values once the nodes restart with the file;
    /// the old keys stay to open the values they sealed.
    RotateSecretsKey {
        /// The key file (`secrets.key` as `certs init` wrote it).
        #[arg(long)]
        file: PathBuf,
    },
}

pub(super) fn run(command: CertsCommand) -> Result<()> {
    match command {
        CertsCommand::Init {
            dir,
            node_ids,
            regions,
            server_names,
        } => {
            transport::certs::init_dir(&dir, &node_ids, &regions, &server_names)?;
            println!("certificates written to {}", dir.display());
            println!(
                "secrets key written to {} (secrets_key in each node's config; keep it private)",
                dir.join(transport::sealing::KEY_FILE_NAME).display()
            );
        }
        CertsCommand::AddNode {
            dir,
            id,
            server_names,
        } => {
            transport::certs::issue_node(&dir, id, &server_names)?;
            println!(
                "node certificate for node {id} written to {}",
                dir.display()
            );
        }
        CertsCommand::AddAgent { dir, region } => {
            transport::certs::issue_agent(&dir, &region)?;
            println!(
                "agent certificate for {region} written to {}",
                dir.display()
            );
        }
        CertsCommand::AddOperator {
            dir,
            name,
            role,
            environments,
        } => {
            let role = wire::access::Role::parse(&role).map_err(anyhow::Error::msg)?;
            let grant = wire::access::Grant {
                name,
                role,
                environments,
            };
            let bundle = transport::certs::issue_named_operator(&dir, &grant)?;
            let scope = if grant.environments.is_empty() {
                "every environment".to_string()
            } else {
                grant.environments.join(",")
            };
            println!(
                "operator certificate for {} ({}, {scope}) written to {} and {}",
                grant.name,
                role.as_str(),
                bundle.cert.display(),
                bundle.key.display()
            );
        }
        CertsCommand::Check { dir, output } => check(&dir, output)?,
        CertsCommand::Renew {
            dir,
            nodes,
            agents,
            operator,
            operators,
            days,
        } => {
            let selection = RenewSelection {
                nodes,
                agents,
                operator,
                operators,
            };
            for renewed in renew::renew(&dir, &selection, days)? {
                println!(
                    "renewed {} ({}), valid until {}",
                    renewed.bundle.cert.display(),
                    renewed.identity,
                    rfc3339(renewed.not_after_secs)
                );
            }
            println!(
                "running nodes and krane load the new files within their \
                 tls.reload_interval_ms; copy them to the hosts that read them elsewhere"
            );
        }
        CertsCommand::RotateCa { dir } => {
            let rotated = renew::rotate_ca(&dir)?;
            println!(
                "new CA '{}' added to {} (old and new CA trusted); {} signs from now on, \
                 the old key is kept as {}",
                rotated.subject,
                rotated.bundle.display(),
                rotated.key.display(),
                rotated.old_key.display()
            );
            println!(
                "next: copy {} to every node and krane, wait for the reload \
                 (ctrl_tls_reloads_total), then `ctrl certs renew`, then `ctrl certs drop-old-ca`",
                rotated.bundle.display()
            );
        }
        CertsCommand::DropOldCa { dir } => {
            let dropped = renew::drop_old_cas(&dir)?;
            println!(
                "{dropped} old CA certificate(s) dropped from {}; copy it to every node and krane",
                transport::certs::ca_bundle(&dir).cert.display()
            );
        }
        CertsCommand::RotateSecretsKey { file } => {
            let id = transport::sealing::rotate_file(&file)?;
            println!(
                "key {id} added to {} and seals from each node's next start; \
                 copy the file to every node, then restart them one at a time",
                file.display()
            );
        }
        CertsCommand::Revoke { .. } | CertsCommand::Revoked { .. } => {
            bail!("ctrl certs revoke and revoked talk to the cluster (run_remote)")
        }
    }
    Ok(())
}

/// Bound on asking the cluster which environments exist, after issuing a
/// scoped operator certificate.
const PATTERN_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The patterns of `patterns` that match none of `environments`.
fn unmatched<'a>(patterns: &'a [String], environments: &[&str]) -> Vec<&'a str> {
    patterns
        .iter()
        .filter(|p| {
            !environments
                .iter()
                .any(|e| wire::access::pattern_matches(p, e))
        })
        .map(String::as_str)
        .collect()
}

/// After `add-operator`: warns about each scope pattern that matches no
/// environment the cluster has now (accepted all the same: the
/// environment may come later), or says why it could not ask.
pub(super) async fn warn_unmatched(config: Result<OperatorConfig>, patterns: &[String]) {
    if patterns.is_empty() {
        return;
    }
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            eprintln!("note: the environment patterns were not checked against the cluster: {e}");
            return;
        }
    };
    let environments = async {
        let client = Client::new(&config)?;
        let page = |after| ListEnvironments {
            after,
            limit: wire::operator::LIST_PAGE_MAX,
        };
        anyhow::Ok(client.all_pages(page).await?)
    };
    match tokio::time::timeout(PATTERN_CHECK_TIMEOUT, environments).await {
        Ok(Ok(environments)) => {
            let ids: Vec<&str> = environments
                .iter()
                .map(|e| e.environment.id.as_str())
                .collect();
            for pattern in unmatched(patterns, &ids) {
                eprintln!(
                    "warning: the pattern {pattern:?} matches no environment the cluster has now \
                     (accepted: it applies to environments created later)"
                );
            }
        }
        Ok(Err(e)) => {
            eprintln!("note: the environment patterns were not checked against the cluster: {e}")
        }
        Err(_) => eprintln!(
            "note: the environment patterns were not checked: the cluster did not answer within {} s",
            PATTERN_CHECK_TIMEOUT.as_secs()
        ),
    }
}

impl CertsCommand {
    /// The scope patterns of an `add-operator` (none for other commands).
    pub(super) fn scope_patterns(&self) -> Vec<String> {
        match self {
            CertsCommand::AddOperator { environments, .. } => environments.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether the command talks to the running cluster (the others work
    /// on files only).
    pub(super) fn needs_cluster(&self) -> bool {
        matches!(
            self,
            CertsCommand::Revoke { .. } | CertsCommand::Revoked { .. }
        )
    }
}

/// `ctrl certs revoke` and `ctrl certs revoked`.
pub(super) async fn run_remote(config: &OperatorConfig, command: CertsCommand) -> Result<()> {
    let client = Client::new(config)?;
    match command {
        CertsCommand::Revoke {
            serial,
            operator,
            agent,
            reason,
            output,
        } => {
            let target = match (serial, operator, agent) {
                (Some(serial), None, None) => RevokedTarget::Serial(normalize_serial(&serial)?),
                (None, Some(name), None) => RevokedTarget::Operator(name),
                (None, None, Some(region)) => RevokedTarget::Agent(region),
                _ => bail!("name exactly one of --serial, --operator and --agent"),
            };
            let revocation = client.call(RevokeCertificate { target, reason }).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&revocation)?),
                Output::Text => {
                    println!(
                        "revoked {} at {} by {}: {}",
                        revocation.target,
                        rfc3339(revocation.revoked_at_ms / 1_000),
                        revocation.revoked_by,
                        revocation.reason
                    );
                }
            }
        }
        CertsCommand::Revoked { output } => {
            let revocations = client.call(ListRevocations).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&revocations)?),
                Output::Text => print!("{}", revoked_table(&revocations)),
            }
        }
        other => bail!("{other:?} works on files, not on the cluster"),
    }
    Ok(())
}

/// The text table of `ctrl certs revoked`.
fn revoked_table(revocations: &[Revocation]) -> String {
    let mut out = format!("{:<48} {:<20} {:<24} {}\n", "REVOKED", "AT", "BY", "REASON");
    for r in revocations {
        out.push_str(&format!(
            "{:<48} {:<20} {:<24} {}\n",
            r.target.key(),
            rfc3339(r.revoked_at_ms / 1_000),
            r.revoked_by,
            r.reason
        ));
    }
    out
}

/// One certificate as `ctrl certs check -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CheckLine {
    /// The file it is in.
    pub file: String,
    /// Its position in the file (a CA bundle holds several).
    pub index: usize,
    /// `ca`, `node`, `operator`, `agent` or `other`.
    pub kind: CertKind,
    /// The subject's common name.
    pub subject: String,
    /// The `ctrl://` identity it names, if any.
    pub identity: Option<String>,
    /// The serial number, hex.
    pub serial: String,
    /// Valid until, seconds since the Unix epoch.
    pub not_after_secs: u64,
    /// The same, RFC 3339 in UTC.
    pub not_after: String,
    /// Whole days left (negative once expired).
    pub days_left: i64,
    /// `ok`, `expires_within_30_days`, `expires_within_7_days`, `expired`.
    pub status: ExpiryStatus,
}

impl CheckLine {
    pub(crate) fn new(info: &CertInfo, now_secs: u64) -> CheckLine {
        CheckLine {
            file: info.file.display().to_string(),
            index: info.index,
            kind: info.kind,
            subject: info.subject.clone(),
            identity: info.identity.clone(),
            serial: info.serial.clone(),
            not_after_secs: info.not_after_secs,
            not_after: rfc3339(info.not_after_secs),
            days_left: expiry::days_left(info.not_after_secs, now_secs),
            status: expiry::expiry_status(info.not_after_secs, now_secs),
        }
    }
}

/// What `ctrl certs check -o json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CheckReport {
    /// Now, seconds since the Unix epoch.
    pub checked_at_secs: u64,
    /// Every certificate read.
    pub certificates: Vec<CheckLine>,
    /// The files that did not read, each error naming its file.
    pub errors: Vec<String>,
}

impl CheckReport {
    fn expired(&self) -> usize {
        self.certificates
            .iter()
            .filter(|c| c.status == ExpiryStatus::Expired)
            .count()
    }
}

fn check(dir: &Path, output: Output) -> Result<()> {
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let inspection = expiry::inspect_dir(dir)?;
    let report = CheckReport {
        checked_at_secs: now_secs,
        certificates: inspection
            .certs
            .iter()
            .map(|info| CheckLine::new(info, now_secs))
            .collect(),
        errors: inspection.errors.iter().map(|e| e.to_string()).collect(),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => print!("{}", check_text(&report)),
    }
    let expired = report.expired();
    if expired > 0 || !report.errors.is_empty() {
        bail!(
            "{expired} certificate(s) expired, {} file(s) unreadable in {}",
            report.errors.len(),
            dir.display()
        );
    }
    Ok(())
}

fn check_text(report: &CheckReport) -> String {
    let mut out = format!(
        "{:<28} {:<9} {:<28} {:<20} {:>9}  {}\n",
        "FILE", "KIND", "IDENTITY", "NOT AFTER", "DAYS LEFT", "STATUS"
    );
    for line in &report.certificates {
        let file = Path::new(&line.file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| line.file.clone());
        let file = if line.index > 0 {
            format!("{file} #{}", line.index + 1)
        } else {
            file
        };
        let who = line
            .identity
            .clone()
            .unwrap_or_else(|| line.subject.clone());
        let kind = serde_json::to_value(line.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "{file:<28} {kind:<9} {who:<28} {:<20} {:>9}  {}\n",
            line.not_after,
            line.days_left,
            line.status.as_str()
        ));
    }
    for error in &report.errors {
        out.push_str(&format!("unreadable: {error}\n"));
    }
    out
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm), for days since 1970.
    let z = i64::try_from(days).unwrap_or(i64::MAX / 2) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_matching_no_environment_are_the_ones_warned_about() {
        let patterns: Vec<String> = ["staging-*", "prod", "qa-*"].map(String::from).to_vec();
        let environments = ["staging-eu", "prod-eu", "dev"];
        assert_eq!(unmatched(&patterns, &environments), vec!["prod", "qa-*"]);
        assert_eq!(unmatched(&patterns, &[]), vec!["staging-*", "prod", "qa-*"]);
        assert!(unmatched(&[], &environments).is_empty());
    }

    #[test]
    fn rfc3339_of_known_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_524_611), "2026-11-24T12:50:11Z");
        assert_eq!(rfc3339(253_402_300_799), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn an_expired_certificate_fails_the_check_and_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        transport::certs::init_dir(dir.path(), &[1], &["us-east".into()], &[]).unwrap();
        check(dir.path(), Output::Text).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let expired = transport::certs::CertBundle::in_dir(dir.path(), "agent-old");
        transport::certs::issue_with_validity(
            dir.path(),
            &expired,
            &transport::Identity::Agent {
                region: "old".into(),
            },
            now - 100_000,
            now - 1_000,
        )
        .unwrap();
        let error = check(dir.path(), Output::Json).unwrap_err();
        assert!(
            error.to_string().contains("1 certificate(s) expired"),
            "{error}"
        );
        let inspection = expiry::inspect_dir(dir.path()).unwrap();
        let line = inspection
            .certs
            .iter()
            .map(|c| CheckLine::new(c, now))
            .find(|l| l.identity.as_deref() == Some("ctrl://agent/old"))
            .unwrap();
        assert_eq!(line.status, ExpiryStatus::Expired);
        assert_eq!(line.days_left, -1);
        let text = check_text(&CheckReport {
            checked_at_secs: now,
            certificates: vec![line],
            errors: vec!["junk.pem: bad".into()],
        });
        assert!(
            text.contains("agent-old.pem") && text.contains("expired"),
            "{text}"
        );
        assert!(text.contains("unreadable: junk.pem"), "{text}");
    }
}
