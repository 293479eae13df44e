//! `ctrl backup`, `ctrl backup verify`, `ctrl restore` and `ctrl recover`:
//! disaster recovery (the runbook is in README).
//!
//! - `backup --out FILE` asks one node (the first of the operator config
//!   that answers) for a backup cut from one read transaction, streamed in
//!   chunks; the file is checked before it is written (temp file, fsync,
//!   rename). `--include-ca` seals the CA with a passphrase into it.
//! - `backup verify FILE` checks a file offline.
//! - `restore FILE --data-dir DIR --node-id N --members …` builds a fresh
//!   data directory from a backup: the state under a new cluster epoch,
//!   the Raft metadata naming the new members at the backup's log id.
//! - `recover --plan|--apply --data-dir DIR …` reads stopped nodes' data
//!   directories and makes the most advanced survivor a one-member cluster.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::backup::{self, CaFiles, Verified};
use node::boot::{RAFT_LOG_FILE, SNAPSHOT_DIR, STATE_FILE};
use node::raft::NodeId;
use node::raft::log_store::{self, LogSummary};
use node::raft::state_machine::decode_raft_meta;
use openraft::{BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, Vote};

/// Default bound on a whole backup's transfer.
pub(super) const BACKUP_TIMEOUT_MS: u64 = 300_000;
/// Bound on asking one old member whether it still answers.
pub(super) const RECOVER_PROBE_TIMEOUT_MS: u64 = 3_000;
/// Most members a `--members` list may name.
pub(super) const MEMBERS_MAX: usize = 16;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BackupArgs {
    #[command(subcommand)]
    pub command: Option<BackupCommand>,
    /// Where to write the backup (written whole, then renamed into place).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also seal the cluster CA (certificate and key) into the backup,
    /// encrypted with the passphrase of `--passphrase-file`.
    #[arg(long, requires = "passphrase_file")]
    pub include_ca: bool,
    /// The CA directory (`ca.pem`, `ca.key`; default: the directory of
    /// the operator config's CA certificate).
    #[arg(long)]
    pub ca_dir: Option<PathBuf>,
    /// A file whose first line is the passphrase.
    #[arg(long)]
    pub passphrase_file: Option<PathBuf>,
    /// Bound on the whole transfer.
    #[arg(long, default_value_t = BACKUP_TIMEOUT_MS)]
    pub timeout_ms: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BackupCommand {
    /// Check a backup file offline (header, SHA-256, the state in it) and
    /// print its index, time and counts.
    Verify {
        file: PathBuf,
        /// Also open the sealed CA with this passphrase.
        #[arg(long)]
        passphrase_file: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// The backup file.
    pub file: PathBuf,
    /// The new node's data directory (missing or empty).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// This node's id, one of `--members`.
    #[arg(long)]
    pub node_id: NodeId,
    /// Every member of the restored cluster: `1=IP:PORT,2=IP:PORT,…`, the
    /// same list on every member.
    #[arg(long, value_parser = parse_members)]
    pub members: Members,
    /// Print what would be restored, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the CA sealed in the backup into this directory (`ca.pem`,
    /// `ca.key`), opened with `--passphrase-file`.
    #[arg(long, requires = "passphrase_file")]
    pub ca_out: Option<PathBuf>,
    /// A file whose first line is the passphrase.
    #[arg(long)]
    pub passphrase_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("mode").required(true).args(["plan", "apply"]))]
pub(crate) struct RecoverArgs {
    /// Read the data directories and name the most advanced survivor.
    #[arg(long)]
    pub plan: bool,
    /// Make the survivor of `--data-dir` (`--node-id`) a one-member
    /// cluster, keeping its data and identity.
    #[arg(long)]
    pub apply: bool,
    /// A stopped node's data directory (repeat for each survivor).
    #[arg(long, required = true)]
    pub data_dir: Vec<PathBuf>,
    /// The survivor's node id (`--apply`).
    #[arg(long)]
    pub node_id: Option<NodeId>,
    /// Bound on asking each old member whether it still answers.
    #[arg(long, default_value_t = RECOVER_PROBE_TIMEOUT_MS)]
    pub probe_timeout_ms: u64,
}

/// A `--members` list.
#[derive(Debug, Clone)]
pub(crate) struct Members(pub Vec<(NodeId, String)>);

fn parse_members(text: &str) -> Result<Members, String> {
    let mut out: Vec<(NodeId, String)> = Vec::new();
    for part in text.split(',') {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected ID=IP:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| format!("{part:?}: the id must be a number above 0"))?;
        let addr: std::net::SocketAddr = addr
            .trim()
            .parse()
            .map_err(|e| format!("{part:?}: the address: {e}"))?;
        if out.iter().any(|(known, _)| *known == id) {
            return Err(format!("node {id} is named twice"));
        }
        out.push((id, addr.to_string()));
    }
    if out.len() > MEMBERS_MAX {
        return Err(format!("{} members, at most {MEMBERS_MAX}", out.len()));
    }
    out.sort();
    Ok(Members(out))
}

fn passphrase(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the passphrase file {}", path.display()))?;
    Ok(text.lines().next().unwrap_or("").as_bytes().to_vec())
}

fn read_backup(path: &Path) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if len > backup::BACKUP_BYTES_MAX {
        bail!(
            "{} is {len} bytes, more than a backup may be ({})",
            path.display(),
            backup::BACKUP_BYTES_MAX
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn verified(path: &Path) -> Result<Verified> {
    let bytes = read_backup(path)?;
    backup::verify(&bytes).with_context(|| format!("{} is not a usable backup", path.display()))
}

/// Writes `bytes` to `path` atomically: a temp file beside it, fsync,
/// rename, fsync of the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .context("the output path names no file")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename into {}", path.display()))?;
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

fn time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

fn print_summary(v: &Verified) {
    let h = &v.file.header;
    println!(
        "backup of node {} at {} (log index {}, term {})",
        h.node_id,
        time(h.created_at_ms),
        h.applied_index,
        h.applied_term
    );
    println!(
        "versions: schema {}, protocol {}, format {}",
        h.schema_version,
        h.protocol_version,
        backup::BACKUP_FORMAT_VERSION
    );
    match h.identity {
        Some(id) => println!("cluster {:032x} epoch {}", id.cluster_id, id.epoch),
        None => println!("cluster identity: not recorded"),
    }
    for (id, addr) in &h.members {
        let role = if h.voters.contains(id) {
            "voter"
        } else {
            "learner"
        };
        println!("member {id} at {addr} ({role})");
    }
    println!("last pk {}", v.summary.last_pk);
    for (table, count) in &v.summary.counts {
        println!("{table}: {count}");
    }
    println!("state hash {:016x}", v.state_hash);
    println!(
        "ca: {}",
        if v.file.ca.is_some() {
            "included"
        } else {
            "none"
        }
    );
    println!("sha256 {}", hex(&v.file.sha256));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) async fn backup(config: Option<&OperatorConfig>, args: BackupArgs) -> Result<()> {
    if let Some(BackupCommand::Verify {
        file,
        passphrase_file,
    }) = args.command
    {
        let v = verified(&file)?;
        print_summary(&v);
        if let Some(path) = passphrase_file {
            backup::open_ca(&v.file, &passphrase(&path)?)?;
            println!("ca: opens with the passphrase");
        }
        println!("ok");
        return Ok(());
    }
    let config = config.context(
        "no operator config: pass --config FILE or set CTRL_CONFIG (`ctrl serve` prints the path)",
    )?;
    let out = args.out.context("--out FILE is required")?;
    let client = node::client::Client::new(config)?;
    let bytes = client.backup(args.timeout_ms).await?;
    let mut v = backup::verify(&bytes).context("the node sent a backup that does not verify")?;
    let bytes = if args.include_ca {
        let dir = match &args.ca_dir {
            Some(dir) => dir.clone(),
            None => config
                .tls
                .ca_cert
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default(),
        };
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read the CA file {}", path.display()))
        };
        let files = CaFiles {
            cert_pem: read(transport::certs::CA_CERT_FILE)?,
            key_pem: read(transport::certs::CA_KEY_FILE)?,
        };
        let path = args
            .passphrase_file
            .as_ref()
            .context("--include-ca needs --passphrase-file")?;
        let sealed = backup::seal_ca(&files, &passphrase(path)?, &v.file.header)?;
        let bytes = backup::encode(&v.file.header, &v.file.body, Some(&sealed))?;
        v = backup::verify(&bytes)?;
        bytes
    } else {
        bytes
    };
    write_atomically(&out, &bytes)?;
    println!("wrote {} ({} bytes)", out.display(), bytes.len());
    print_summary(&v);
    Ok(())
}

/// Fails unless `dir` is missing or empty.
fn fresh_dir(dir: &Path) -> Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if let Some(entry) = entries.next() {
                let name = entry.map(|e| e.file_name().to_string_lossy().into_owned());
                bail!(
                    "the data directory {} is not empty (it holds {}); restore builds a new \
                     node's directory and never overwrites one",
                    dir.display(),
                    name.unwrap_or_else(|_| "unreadable entries".into())
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", dir.display())),
    }
}

pub(super) fn restore(args: RestoreArgs) -> Result<()> {
    let v = verified(&args.file)?;
    let members = &args.members.0;
    if !members.iter().any(|(id, _)| *id == args.node_id) {
        bail!("--node-id {} is not one of --members", args.node_id);
    }
    let header = &v.file.header;
    let old_epoch = header.identity.map_or(0, |i| i.epoch);
    let epoch = backup::restored_epoch(&v.file.sha256, members, old_epoch);
    let identity = match header.identity {
        Some(identity) => storage::ClusterIdentity { epoch, ..identity },
        // A backup of a cluster that never recorded one: a new identity
        // derived from the backup, the same on every member.
        None => storage::ClusterIdentity {
            cluster_id: u128::from(epoch) << 64 | u128::from(epoch.rotate_left(17)),
            epoch,
        },
    };
    print_summary(&v);
    println!(
        "restore as node {} of {} (cluster {:032x}, new epoch {epoch}) into {}",
        args.node_id,
        members
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(","),
        identity.cluster_id,
        args.data_dir.display()
    );
    fresh_dir(&args.data_dir)?;
    if args.dry_run {
        println!("dry run: nothing written");
        return Ok(());
    }
    let raft_meta = backup::restored_raft_meta(header, members)?;
    std::fs::create_dir_all(args.data_dir.join(SNAPSHOT_DIR))
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let state_path = args.data_dir.join(STATE_FILE);
    let store = storage::Store::open(&state_path)
        .with_context(|| format!("cannot create {}", state_path.display()))?;
    store
        .restore_snapshot(&v.file.body, identity, raft_meta)
        .with_context(|| format!("cannot restore into {}", state_path.display()))?;
    drop(store);
    // The vote: the backup's term, for this node, uncommitted; the first
    // election is of the next term, after the restored log id.
    let log_path = args.data_dir.join(RAFT_LOG_FILE);
    log_store::write_vote_offline(&log_path, &Vote::new(header.applied_term, args.node_id))
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    if let Some(dir) = &args.ca_out {
        let path = args
            .passphrase_file
            .as_ref()
            .context("--ca-out needs --passphrase-file")?;
        let files = backup::open_ca(&v.file, &passphrase(path)?)?;
        std::fs::create_dir_all(dir)?;
        write_atomically(
            &dir.join(transport::certs::CA_CERT_FILE),
            files.cert_pem.as_bytes(),
        )?;
        write_atomically(
            &dir.join(transport::certs::CA_KEY_FILE),
            files.key_pem.as_bytes(),
        )?;
        println!("wrote the CA into {}", dir.display());
    }
    println!("restored; start the node with this data_dir and node_id (no peers needed)");
    Ok(())
}

/// What one stopped node's data directory holds.
struct Survivor {
    dir: PathBuf,
    applied: Option<LogId<NodeId>>,
    membership: Membership<NodeId, BasicNode>,
    log: LogSummary,
    last_pk: u64,
    snapshot_index: Option<u64>,
}

fn read_survivor(dir: &Path) -> Result<Survivor> {
    let state_path = dir.join(STATE_FILE);
    if !state_path.exists() {
        bail!(
            "{} has no {STATE_FILE}: not a node's data directory",
            dir.display()
        );
    }
    let store = storage::Store::open(&state_path).with_context(|| {
        format!(
            "cannot open {} (is the node still running? stop it first)",
            state_path.display()
        )
    })?;
    let view = store.read()?;
    let (applied, stored) = decode_raft_meta(view.raft_meta())
        .map_err(|e| anyhow::anyhow!("{}: the Raft metadata: {e}", state_path.display()))?;
    let last_pk = view.last_pk();
    drop(view);
    drop(store);
    let log_path = dir.join(RAFT_LOG_FILE);
    let log = log_store::summarize_offline(&log_path, applied.map_or(0, |id| id.index))
        .with_context(|| {
            format!(
                "cannot read {} (is the node still running? stop it first)",
                log_path.display()
            )
        })?;
    let membership = match &log.membership {
        Some((id, m)) if Some(*id) > applied => m.clone(),
        _ => stored.membership().clone(),
    };
    let snapshot_index = std::fs::read(dir.join(SNAPSHOT_DIR).join("snapshot.bin"))
        .ok()
        .map(|_| applied.map_or(0, |id| id.index));
    Ok(Survivor {
        dir: dir.to_path_buf(),
        applied,
        membership,
        log,
        last_pk,
        snapshot_index,
    })
}

fn log_id(id: Option<LogId<NodeId>>) -> String {
    id.map_or_else(
        || "-".into(),
        |id| format!("{}@term{}", id.index, id.leader_id.term),
    )
}

pub(super) async fn recover(config: Option<&OperatorConfig>, args: RecoverArgs) -> Result<()> {
    let mut survivors = Vec::new();
    for dir in &args.data_dir {
        survivors.push(read_survivor(dir)?);
    }
    for s in &survivors {
        println!(
            "{}: last log {} committed {} applied {} purged {} snapshot {} last pk {} vote {}",
            s.dir.display(),
            log_id(s.log.last_log_id),
            log_id(s.log.committed),
            log_id(s.applied),
            log_id(s.log.last_purged),
            s.snapshot_index
                .map_or_else(|| "-".into(), |i| i.to_string()),
            s.last_pk,
            s.log.vote.map_or_else(|| "-".into(), |v| v.to_string()),
        );
    }
    // The most advanced: the greatest last log id (Raft's own order).
    let best = survivors
        .iter()
        .max_by_key(|s| s.log.last_log_id.or(s.applied))
        .context("no data directory given")?;
    let members: Vec<NodeId> = best.membership.voter_ids().collect();
    println!(
        "most advanced survivor: {} (last log {}); members were {:?}",
        best.dir.display(),
        log_id(best.log.last_log_id.or(best.applied)),
        members
    );
    if let Some(ms) = best.log.last_command_ms {
        println!(
            "its last write was made at {}; writes acknowledged by the lost majority after it \
             are lost (their count is not known here)",
            time(ms)
        );
    }
    for s in &survivors {
        let behind = best
            .log
            .last_log_id
            .map_or(0, |b| b.index)
            .saturating_sub(s.log.last_log_id.map_or(0, |l| l.index));
        if behind > 0 {
            println!("{} is {behind} entries behind it", s.dir.display());
        }
    }
    if args.plan {
        println!(
            "to recover: stop every node, then `ctrl recover --apply --data-dir {} --node-id N`",
            best.dir.display()
        );
        return Ok(());
    }
    let node_id = args
        .node_id
        .context("--apply needs --node-id (the survivor's id)")?;
    if args.data_dir.len() != 1 {
        bail!("--apply takes the one survivor's --data-dir");
    }
    let survivor = &survivors[0];
    if !survivor.membership.nodes().any(|(id, _)| *id == node_id) {
        bail!(
            "node {node_id} is not a member of {}",
            survivor.dir.display()
        );
    }
    // Refuse while the old majority still answers: then the cluster is
    // not lost, and a second, one-member cluster would split it.
    let others: Vec<(NodeId, String)> = survivor
        .membership
        .nodes()
        .filter(|(id, _)| **id != node_id)
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    let voters = survivor.membership.voter_ids().count();
    let majority = voters / 2 + 1;
    let config = config.context(
        "recover --apply asks the other members whether they still answer: it needs the \
         operator config (--config FILE or CTRL_CONFIG)",
    )?;
    let mut answering = Vec::new();
    for (id, addr) in &others {
        if answers(config, addr, args.probe_timeout_ms).await {
            answering.push(format!("{id} at {addr}"));
        }
    }
    // The survivor itself is stopped; it would make one more.
    if answering.len() + 1 >= majority {
        bail!(
            "refused: {} of the old members still answer ({}); with this node they are a \
             majority of {voters}, so the cluster is not lost. Restart this node instead",
            answering.len(),
            answering.join(", ")
        );
    }
    let last = survivor
        .log
        .last_log_id
        .or(survivor.applied)
        .context("the survivor's log is empty: nothing to recover")?;
    let vote_term = survivor.log.vote.map_or(0, |v| v.leader_id().term);
    let term = last.leader_id.term.max(vote_term) + 1;
    let addr = survivor
        .membership
        .get_node(&node_id)
        .map(|n| n.addr.clone())
        .unwrap_or_default();
    let alone = Membership::new(
        vec![std::collections::BTreeSet::from([node_id])],
        std::collections::BTreeMap::from([(node_id, BasicNode { addr: addr.clone() })]),
    );
    let entry: Entry<node::raft::TypeConfig> = Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, node_id), last.index + 1),
        payload: EntryPayload::Membership(alone),
    };
    let log_path = survivor.dir.join(RAFT_LOG_FILE);
    log_store::append_offline(&log_path, &entry, &Vote::new(term, node_id))
        .with_context(|| format!("cannot write {}", log_path.display()))?;
    // The state's Raft metadata stays as it is: the membership entry
    // appended after the applied index is the effective one.
    println!(
        "node {node_id} at {addr} is now the only member (term {term}, membership at index {}); \
         start it, then add nodes with `ctrl cluster add-node`",
        last.index + 1
    );
    Ok(())
}

/// Whether a node answers at `addr` within `timeout_ms` (any answer,
/// even a refusal, is an answer).
async fn answers(config: &OperatorConfig, addr: &str, timeout_ms: u64) -> bool {
    let Ok(addr) = addr.parse() else {
        return false;
    };
    let single = OperatorConfig {
        endpoints: vec![addr],
        request_timeout_ms: timeout_ms,
        ..config.clone()
    };
    let Ok(client) = node::client::Client::new(&single) else {
        return false;
    };
    let call = client.call_once(wire::operator::request::NodeStatus, timeout_ms);
    match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), call).await {
        Ok(Ok(_)) | Ok(Err(node::client::ClientError::Server(_))) => true,
        Ok(Err(_)) | Err(_) => false,
    }
}
