//! Time-boxed fuzzing of the untrusted inputs other than the client
//! protocols (those are `wire/tests/fuzz.rs`): Raft RPC frames and Raft log
//! records (their golden encodings), state snapshots (what a follower
//! installs from a leader's chunks and what a backup holds), backup files,
//! and the node, agent and operator config files. Every input is mutated
//! with [`wire::fuzz::mutate`]; where a checksum guards the bytes, each
//! mutation is also resealed under a fresh checksum, so that it reaches
//! the parser behind it. A snapshot that fails to import must leave the
//! store as it was.
//!
//! It passes when nothing panics and prints the executions per target.
//! `FUZZ_SECONDS` is the whole budget (default 4 s), split evenly between
//! the targets; `FUZZ_SEED` replays a run; a failure prints the seed, the
//! target and the input in hex. A long run:
//!
//!     FUZZ_SECONDS=3600 cargo test --release -p integration --test fuzz_inputs -- --nocapture

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use config::{AgentConfig, ConfigFile, NodeConfig, OperatorConfig, TlsFiles};
use integration::cluster::TestNode;
use integration::kit::wait::bounded;
use node::raft::TypeConfig;
use node::raft::network::{RaftRequest, RaftResponse};
use openraft::{BasicNode, Entry, EntryPayload, LogId, StoredMembership, Vote};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ring::digest::{SHA256, digest};
use wire::digest::Fnv1a;
use wire::fuzz;

/// The whole budget under `cargo test`, in seconds.
const DEFAULT_SECONDS: u64 = 4;
/// Bound on building the corpus (a node, three deploys, a backup).
const CORPUS_TIMEOUT: Duration = Duration::from_secs(60);
/// The limit forged length prefixes are put near (the default frame).
const FORGED_LIMIT: u32 = 1 << 20;
/// A state snapshot's header: magic (8), schema version (4), FNV-1a (8).
const SNAPSHOT_HEADER_BYTES: usize = 20;
/// Where a snapshot's checksum sits in its header.
const SNAPSHOT_CHECKSUM_AT: usize = 12;
/// A backup file ends with the SHA-256 of everything before it.
const BACKUP_DIGEST_BYTES: usize = 32;
/// One import into a real store per this many snapshot inputs (imports
/// write to disk).
const IMPORT_EVERY: u64 = 64;
/// Deploys in the state the snapshot and backup hold.
const DEPLOYS: usize = 3;

/// Valid inputs, each target's starting points.
struct Corpus {
    raft_requests: Vec<Vec<u8>>,
    raft_responses: Vec<Vec<u8>>,
    /// Golden Raft log records, by their type's name.
    log_records: Vec<(String, Vec<u8>)>,
    snapshot: Vec<u8>,
    backup: Vec<u8>,
    /// Config files, by their kind (`node`, `agent`, `operator`).
    configs: Vec<(&'static str, String)>,
}

/// The `case NAME HEX` lines of a golden file.
fn golden_cases(path: &Path) -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter_map(|line| line.strip_prefix("case "))
        .map(|case| {
            let (name, hex) = case.split_once(' ').expect("case NAME HEX");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (name.to_string(), bytes)
        })
        .collect()
}

fn golden_dir(kind: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../node/tests/golden")
        .join(kind)
}

/// A node holding deploys (their topologies, sentinels, policies and
/// journal), its backup taken by `ctrl backup`, and the config files of
/// a three-node site.
async fn corpus(dir: &Path) -> Corpus {
    let node = TestNode::start().await.expect("a node");
    let operator = node.operator().expect("operator");
    for i in 0..DEPLOYS {
        let id = operator
            .create(
                integration::requests::deployment(["us-east", "eu-west"])
                    .owner("ws_1", "proj_1", &format!("env_{i}"))
                    .own_environment()
                    .env_var("GREETING", "hello")
                    .build(),
            )
            .await
            .expect("a deploy");
        operator.started(&id).await.expect("started");
    }
    let operator_path = dir.join("operator.toml");
    std::fs::write(&operator_path, node.operator.to_toml_string()).expect("operator config");
    let backup_path = dir.join("fuzz.ctrlbak");
    integration::kit::ctrl::with_config(&operator_path)
        .await
        .expect("the ctrl binary")
        .ok(&["backup", "--out", backup_path.to_str().expect("UTF-8")])
        .await
        .expect("ctrl backup");
    let backup = std::fs::read(&backup_path).expect("the backup");
    let snapshot = node::backup::decode(&backup).expect("a valid backup").body;
    node.node.shutdown().await;

    let (nodes, operator_config) =
        integration::plan::plan(&dir.join("site"), 3, |_| {}).expect("a site");
    let agent = AgentConfig::new(
        "us-east",
        nodes.iter().map(|n| n.listen_addr.into()).collect(),
        TlsFiles::in_dir(&dir.join("site/certs"), "agent-us-east"),
    );
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ctrl/node.toml"),
    )
    .expect("deploy/ctrl/node.toml");
    let mut configs = vec![
        ("node", shipped),
        ("agent", agent.to_toml_string()),
        ("operator", operator_config.to_toml_string()),
    ];
    configs.extend(nodes.iter().map(|n| ("node", n.to_toml_string())));

    let log_records = ["Entry", "EntryPayload", "Vote", "LogId", "StoredMembership"]
        .iter()
        .flat_map(|kind| {
            golden_cases(&golden_dir("raft_log").join(format!("{kind}.hex")))
                .into_iter()
                .map(|(_, bytes)| (kind.to_string(), bytes))
        })
        .collect();
    let cases = |file: &str| {
        golden_cases(&golden_dir("raft_rpc").join(file))
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect::<Vec<_>>()
    };
    Corpus {
        raft_requests: cases("RaftRequest.hex"),
        raft_responses: cases("RaftResponse.hex"),
        log_records,
        snapshot,
        backup,
        configs,
    }
}

/// `bytes`' body under a fresh checksum in its snapshot header.
fn reseal_snapshot(bytes: &mut [u8]) {
    if bytes.len() < SNAPSHOT_HEADER_BYTES {
        return;
    }
    let mut checksum = Fnv1a::new();
    checksum.write(&bytes[SNAPSHOT_HEADER_BYTES..]);
    bytes[SNAPSHOT_CHECKSUM_AT..SNAPSHOT_HEADER_BYTES]
        .copy_from_slice(&checksum.finish().to_le_bytes());
}

/// A mutated copy of `input` (its first `keep` bytes left alone).
fn mutated(input: &[u8], keep: usize, rng: &mut StdRng) -> Vec<u8> {
    let keep = keep.min(input.len());
    let mut rest = input[keep..].to_vec();
    fuzz::mutate(&mut rest, rng, FORGED_LIMIT);
    let mut out = input[..keep].to_vec();
    out.extend(rest);
    out
}

fn pick<'a, T>(items: &'a [T], rng: &mut StdRng) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// One fuzz target: its name, how it makes a random input, and what it
/// feeds the input to (which must not panic).
struct Target<'a> {
    name: &'static str,
    make: Box<Make<'a>>,
    feed: Box<Feed<'a>>,
}

/// Makes one input of a target.
type Make<'a> = dyn Fn(&mut StdRng) -> Vec<u8> + 'a;
/// Feeds one input to what a target fuzzes.
type Feed<'a> = dyn FnMut(&[u8], &mut StdRng) + 'a;

fn target<'a>(
    name: &'static str,
    make: impl Fn(&mut StdRng) -> Vec<u8> + 'a,
    feed: impl FnMut(&[u8], &mut StdRng) + 'a,
) -> Target<'a> {
    Target {
        name,
        make: Box::new(make),
        feed: Box::new(feed),
    }
}

#[test]
fn untrusted_inputs_survive_mutation() {
    let seed = fuzz::seed();
    let budget = fuzz::budget(DEFAULT_SECONDS);
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let corpus = runtime.block_on(bounded(CORPUS_TIMEOUT, corpus(dir.path())));
    drop(runtime);

    let store = storage::Store::open(dir.path().join("import.redb")).expect("a store");
    store
        .import_snapshot(&corpus.snapshot)
        .expect("the valid snapshot imports");
    let imported_hash = store.read().expect("read").state_hash().expect("hash");
    let mut imports = 0u64;
    let node_path = Path::new("node.toml");

    let mut targets: Vec<Target<'_>> = vec![
        target(
            "raft_request",
            |rng| mutated(pick::<Vec<u8>>(&corpus.raft_requests, rng), 0, rng),
            |input, _| drop(wire::frame::decode::<RaftRequest>(input)),
        ),
        target(
            "raft_response",
            |rng| mutated(pick::<Vec<u8>>(&corpus.raft_responses, rng), 0, rng),
            |input, _| drop(wire::frame::decode::<RaftResponse>(input)),
        ),
        target(
            "raft_log_record",
            |rng| {
                // The record's kind in the first byte, then its bytes.
                let index = rng.random_range(0..corpus.log_records.len());
                let mut input = vec![u8::try_from(index % 256).unwrap_or(0)];
                input.extend(mutated(&corpus.log_records[index].1, 0, rng));
                input
            },
            |input, _| {
                let Some((index, bytes)) = input.split_first() else {
                    return;
                };
                let kind = corpus
                    .log_records
                    .get(usize::from(*index))
                    .map_or("", |(kind, _)| kind.as_str());
                match kind {
                    "Entry" => drop(wire::frame::decode::<Entry<TypeConfig>>(bytes)),
                    "EntryPayload" => drop(wire::frame::decode::<EntryPayload<TypeConfig>>(bytes)),
                    "Vote" => drop(wire::frame::decode::<Vote<u64>>(bytes)),
                    "LogId" => drop(wire::frame::decode::<LogId<u64>>(bytes)),
                    _ => drop(wire::frame::decode::<StoredMembership<u64, BasicNode>>(
                        bytes,
                    )),
                }
            },
        ),
        target(
            "snapshot",
            |rng| mutated(&corpus.snapshot, 0, rng),
            |input, _| drop(storage::snapshot::inspect_snapshot(input)),
        ),
        target(
            "snapshot_resealed",
            |rng| {
                let mut input = mutated(&corpus.snapshot, SNAPSHOT_HEADER_BYTES, rng);
                reseal_snapshot(&mut input);
                input
            },
            |input, rng| {
                let inspected = storage::snapshot::inspect_snapshot(input);
                if rng.random_range(0..IMPORT_EVERY) != 0 {
                    return;
                }
                imports += 1;
                match store.import_snapshot(input) {
                    Ok(()) => {
                        assert!(inspected.is_ok(), "imported what inspect refused");
                        store
                            .import_snapshot(&corpus.snapshot)
                            .expect("the valid snapshot imports again");
                    }
                    Err(_) => {
                        let hash = store.read().expect("read").state_hash().expect("hash");
                        assert_eq!(hash, imported_hash, "a refused import changed the store");
                    }
                }
            },
        ),
        target(
            "backup",
            |rng| mutated(&corpus.backup, 0, rng),
            |input, _| drop(node::backup::verify(input)),
        ),
        target(
            "backup_resealed",
            |rng| {
                let covered = &corpus.backup[..corpus.backup.len() - BACKUP_DIGEST_BYTES];
                let mut input = mutated(covered, 0, rng);
                let sealed = digest(&SHA256, &input);
                input.extend_from_slice(sealed.as_ref());
                input
            },
            |input, _| drop(node::backup::verify(input)),
        ),
        target(
            "config",
            |rng| {
                // The config's index in the first byte, then its text.
                let index = rng.random_range(0..corpus.configs.len());
                let mut input = vec![u8::try_from(index % 256).unwrap_or(0)];
                input.extend(mutated(corpus.configs[index].1.as_bytes(), 0, rng));
                input
            },
            |input, _| {
                let Some((index, text)) = input.split_first() else {
                    return;
                };
                let text = String::from_utf8_lossy(text);
                match corpus
                    .configs
                    .get(usize::from(*index))
                    .map(|(kind, _)| *kind)
                {
                    Some("node") => drop(NodeConfig::from_toml_str(&text, node_path)),
                    Some("agent") => drop(AgentConfig::from_toml_str(&text, node_path)),
                    _ => drop(OperatorConfig::from_toml_str(&text, node_path)),
                }
            },
        ),
    ];

    let per_target = budget / u32::try_from(targets.len()).expect("a few targets");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut figures = Vec::new();
    for t in &mut targets {
        let started = Instant::now();
        let mut executions = 0u64;
        while started.elapsed() < per_target {
            let input = (t.make)(&mut rng);
            let outcome = catch_unwind(AssertUnwindSafe(|| (t.feed)(&input, &mut rng)));
            if outcome.is_err() {
                panic!(
                    "{} panicked (FUZZ_SEED={seed}, execution {executions}); input: {}",
                    t.name,
                    fuzz::hex(&input)
                );
            }
            executions += 1;
        }
        assert!(executions > 0, "{} ran", t.name);
        figures.push(format!("{} {executions}", t.name));
    }
    drop(targets);
    eprintln!(
        "fuzz_inputs: executions per target in {per_target:?} each: {} ({imports} imports; FUZZ_SEED={seed})",
        figures.join(", ")
    );
}
