//! Tests of `config/src/node`.

use super::*;
use crate::settings::DEFAULT_HEARTBEAT_INTERVAL_MS;

const PATH: &str = "/etc/ctrl/node.toml";

const MINIMAL: &str = r#"
node_id = 1

[tls]
ca_cert = "/etc/ctrl/ca.pem"
cert = "/etc/ctrl/node-1.pem"
key = "/etc/ctrl/node-1.key"
"#;

fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
    NodeConfig::from_toml_str(text, Path::new(PATH))
}

/// The minimal file with `extra` added at the top level (before the
/// `[tls]` table) and `sections` appended.
fn with(extra: &str, sections: &str) -> String {
    format!("{extra}\n{MINIMAL}\n{sections}")
}

/// The error names the file and `field`, and contains `words`.
fn assert_invalid(text: &str, field: &str, words: &str) {
    let error = parse(text).expect_err("must be invalid");
    assert_eq!(error.field(), Some(field), "{error}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("{PATH}: field \"{field}\": ")),
        "{shown}"
    );
    assert!(shown.contains(words), "{shown} lacks {words}");
}

#[test]
fn single_node_default_round_trips() {
    let config = NodeConfig::single_node_default(Path::new("/var/lib/ctrl"));
    config.validate(Path::new(PATH)).unwrap();
    assert_eq!(config.tls.cert, Path::new("/var/lib/ctrl/certs/node-1.pem"));
    assert_eq!(config.tls.key, Path::new("/var/lib/ctrl/certs/node-1.key"));
    assert_eq!(config.tls.ca_cert, Path::new("/var/lib/ctrl/certs/ca.pem"));
    assert_eq!(config.listen_addr, "127.0.0.1:7400".parse().unwrap());
    assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
}

#[test]
fn full_config_round_trips() {
    let mut config = NodeConfig::single_node_default(Path::new("data"));
    config.advertise_addr = Some("10.0.0.11:7400".parse().unwrap());
    config.listen_addr = "0.0.0.0:7400".parse().unwrap();
    config.peers = vec![
        PeerConfig {
            node_id: 1,
            addr: "10.0.0.11:7400".parse().unwrap(),
        },
        PeerConfig {
            node_id: 2,
            addr: "[fd00::12]:7400".parse().unwrap(),
        },
    ];
    config.raft.heartbeat_interval_ms = 50;
    config.compaction.retention_ms = 60_000;
    config.compaction.request_retention_ms = 120_000;
    let text = config.to_toml_string();
    assert_eq!(parse(&text).unwrap(), config, "{text}");
}

#[test]
fn minimal_file_gets_defaults() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.node_id, 1);
    assert_eq!(config.data_dir, Path::new("./ctrl-data"));
    assert_eq!(config.listen_addr, DEFAULT_LISTEN_ADDR);
    assert_eq!(config.advertise_addr, None);
    assert_eq!(config.advertised_addr(), DEFAULT_LISTEN_ADDR);
    assert!(config.peers.is_empty());
    assert_eq!(config.raft, RaftSettings::default());
    assert_eq!(
        config.raft.heartbeat_interval_ms,
        DEFAULT_HEARTBEAT_INTERVAL_MS
    );
    assert_eq!(config.raft.election_timeout_min_ms, 200);
    assert_eq!(config.raft.election_timeout_max_ms, 400);
    assert_eq!(config.raft.snapshot_logs_since_last, 10_000);
    assert_eq!(config.raft.logs_kept_after_snapshot, 1_000);
    assert_eq!(config.raft.max_payload_entries, 300);
    assert_eq!(config.limits.frame_bytes_max, 1 << 20);
    assert_eq!(config.limits.watch_streams_max, 10_000);
    assert_eq!(config.limits.watch_catch_up_wait_ms, 2_000);
    assert_eq!(config.limits.write_batch_max, 256);
    assert_eq!(config.limits.request_timeout_ms, 5_000);
    assert_eq!(config.limits.slow_consumer_timeout_ms, 30_000);
    assert_eq!(config.watch.progress_interval_ms, 10_000);
    assert_eq!(config.watch.sync_page_resources, 1_000);
    assert_eq!(config.compaction.retention_ms, 3_600_000);
    assert_eq!(config.compaction.request_retention_ms, 86_400_000);
    assert_eq!(config.compaction.interval_ms, 60_000);
    assert_eq!(config.compaction.batch_rows_max, 10_000);
    assert_eq!(config.compaction.keep_rows_min, 10_000);
    assert_eq!(config.compaction.cutoff_step_max_ms, 600_000);
}

#[test]
fn scheduled_backups_are_off_unless_configured_and_bounded() {
    assert_eq!(parse(MINIMAL).unwrap().backup, None);
    let text = with("", "[backup]\ndir = \"/var/backups/ctrl\"\n");
    let backup = parse(&text).unwrap().backup.unwrap();
    assert_eq!(
        backup,
        BackupSettings::in_dir(PathBuf::from("/var/backups/ctrl"))
    );
    assert_eq!(backup.interval_ms, 3_600_000);
    assert_eq!(backup.keep, 24);
    let text = with("", "[backup]\ndir = \"b\"\ninterval_ms = 999\n");
    assert_invalid(&text, "backup.interval_ms", "999");
    let text = with("", "[backup]\ndir = \"b\"\nkeep = 0\n");
    assert_invalid(&text, "backup.keep", "0");
    let text = with("", "[backup]\ninterval_ms = 60000\n");
    assert!(parse(&text).is_err(), "dir is required");
}

#[test]
fn the_cutoff_step_is_at_least_the_interval() {
    let text = with(
        "",
        "[compaction]\ninterval_ms = 60000\ncutoff_step_max_ms = 59999\n",
    );
    assert_invalid(
        &text,
        "compaction.cutoff_step_max_ms",
        "at least compaction.interval_ms (60000)",
    );
    let text = with("", "[compaction]\nkeep_rows_min = 0\n");
    assert_eq!(parse(&text).unwrap().compaction.keep_rows_min, 0);
}

#[test]
fn metrics_addr_is_optional_and_checked() {
    assert_eq!(parse(MINIMAL).unwrap().metrics_addr, None);
    let config = parse(&with("metrics_addr = \"127.0.0.1:9400\"", "")).unwrap();
    assert_eq!(config.metrics_addr, Some("127.0.0.1:9400".parse().unwrap()));
    assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    let error = parse(&with("metrics_addr = \"localhost\"", "")).unwrap_err();
    assert_eq!(error.field(), Some("metrics_addr"), "{error}");
}

#[test]
fn partial_section_keeps_other_defaults() {
    let config = parse(&with("", "[raft]\nelection_timeout_max_ms = 900\n")).unwrap();
    assert_eq!(config.raft.election_timeout_max_ms, 900);
    assert_eq!(config.raft.election_timeout_min_ms, 200);
}

#[test]
fn node_id_must_be_positive() {
    assert_invalid(
        &MINIMAL.replace("node_id = 1", "node_id = 0"),
        "node_id",
        "got 0",
    );
}

#[test]
fn missing_node_id_and_tls_are_named() {
    let error = parse("").unwrap_err();
    assert!(error.to_string().starts_with(PATH), "{error}");
    assert!(matches!(error.field(), Some("node_id" | "tls")), "{error}");
    let error = parse(&MINIMAL.replace("key = \"/etc/ctrl/node-1.key\"", "")).unwrap_err();
    assert_eq!(error.field(), Some("tls.key"), "{error}");
    assert!(error.to_string().contains("missing field `key`"), "{error}");
}

#[test]
fn data_dir_must_not_be_empty() {
    assert_invalid(
        &with("data_dir = \"\"", ""),
        "data_dir",
        "must not be empty",
    );
}

#[test]
fn tls_paths_must_not_be_empty() {
    let text = MINIMAL.replace("/etc/ctrl/node-1.pem", "");
    assert_invalid(&text, "tls.cert", "must not be empty");
}

#[test]
fn unspecified_listen_addr_needs_advertise_addr() {
    let text = with("listen_addr = \"0.0.0.0:7400\"", "");
    assert_invalid(&text, "advertise_addr", "0.0.0.0:7400");
    let text = with(
        "listen_addr = \"0.0.0.0:7400\"\nadvertise_addr = \"10.0.0.11:7400\"",
        "",
    );
    assert_eq!(
        parse(&text).unwrap().advertised_addr(),
        "10.0.0.11:7400".parse().unwrap()
    );
}

#[test]
fn advertise_addr_must_be_connectable() {
    let text = with("advertise_addr = \"0.0.0.0:7400\"", "");
    assert_invalid(&text, "advertise_addr", "specific IP address");
    let text = with("advertise_addr = \"10.0.0.1:0\"", "");
    assert_invalid(&text, "advertise_addr", "port other than 0");
}

#[test]
fn ephemeral_port_only_for_a_single_node() {
    parse(&with("listen_addr = \"127.0.0.1:0\"", "")).unwrap();
    let text = with(
        "listen_addr = \"127.0.0.1:0\"",
        "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n",
    );
    assert_invalid(&text, "listen_addr", "port other than 0");
}

#[test]
fn peer_ids_must_be_unique() {
    let peers = "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n\
                 [[peers]]\nnode_id = 2\naddr = \"10.0.0.13:7400\"\n";
    assert_invalid(&with("", peers), "peers[1].node_id", "listed twice");
}

#[test]
fn peer_addrs_must_be_unique() {
    let peers = "[[peers]]\nnode_id = 2\naddr = \"10.0.0.12:7400\"\n\
                 [[peers]]\nnode_id = 3\naddr = \"10.0.0.12:7400\"\n";
    assert_invalid(
        &with("", peers),
        "peers[1].addr",
        "also the address of node 2",
    );
}

#[test]
fn peer_fields_are_checked() {
    let peers = "[[peers]]\nnode_id = 0\naddr = \"10.0.0.12:7400\"\n";
    assert_invalid(&with("", peers), "peers[0].node_id", "got 0");
    let peers = "[[peers]]\nnode_id = 2\naddr = \"0.0.0.0:7400\"\n";
    assert_invalid(&with("", peers), "peers[0].addr", "specific IP address");
}

#[test]
fn self_in_peers_must_match_advertised_addr() {
    let peers = "[[peers]]\nnode_id = 1\naddr = \"10.0.0.11:7400\"\n";
    assert_invalid(
        &with("", peers),
        "peers[0].addr",
        "advertised address 127.0.0.1:7400",
    );
    let ok = with("advertise_addr = \"10.0.0.11:7400\"", peers);
    assert_eq!(parse(&ok).unwrap().peers.len(), 1);
}

#[test]
fn too_many_peers() {
    let peers: String = (2..=PEERS_MAX as u64 + 2)
        .map(|id| {
            format!(
                "[[peers]]\nnode_id = {id}\naddr = \"10.0.0.{}:7400\"\n",
                id % 250 + 1
            )
        })
        .collect();
    assert_invalid(&with("", &peers), "peers", "between 0 and 64 entries");
}

#[test]
fn heartbeat_must_be_below_election_timeout() {
    let text = with("", "[raft]\nheartbeat_interval_ms = 200\n");
    assert_invalid(
        &text,
        "raft.heartbeat_interval_ms",
        "must be less than election_timeout_min_ms (got 200 >= 200)",
    );
}

#[test]
fn election_min_must_be_below_max() {
    let text = with(
        "",
        "[raft]\nelection_timeout_min_ms = 500\nelection_timeout_max_ms = 300\n",
    );
    let error = parse(&text).unwrap_err();
    assert_eq!(
        error.to_string(),
        "/etc/ctrl/node.toml: field \"raft.election_timeout_min_ms\": \
         must be less than election_timeout_max_ms (got 500 >= 300)"
    );
}

#[test]
fn raft_values_must_be_positive() {
    let text = with("", "[raft]\nheartbeat_interval_ms = 0\n");
    assert_invalid(&text, "raft.heartbeat_interval_ms", "got 0");
    let text = with("", "[raft]\nsnapshot_logs_since_last = 0\n");
    assert_invalid(&text, "raft.snapshot_logs_since_last", "got 0");
    let text = with("", "[raft]\nmax_payload_entries = 0\n");
    assert_invalid(&text, "raft.max_payload_entries", "got 0");
    let text = with("", "[raft]\nlogs_kept_after_snapshot = 100000001\n");
    assert_invalid(&text, "raft.logs_kept_after_snapshot", "between 0 and");
    let config = parse(&with("", "[raft]\nlogs_kept_after_snapshot = 0\n")).unwrap();
    assert_eq!(config.raft.logs_kept_after_snapshot, 0);
    let text = with("", "[raft]\nelection_timeout_max_ms = 99999999999999\n");
    assert_invalid(&text, "raft.election_timeout_max_ms", "between 1 and");
}

#[test]
fn frame_bytes_max_bounds() {
    let text = with("", "[limits]\nframe_bytes_max = 4095\n");
    assert_invalid(
        &text,
        "limits.frame_bytes_max",
        "between 4096 and 67108864 (got 4095)",
    );
    let text = with("", "[limits]\nframe_bytes_max = 67108865\n");
    assert_invalid(&text, "limits.frame_bytes_max", "(got 67108865)");
    parse(&with("", "[limits]\nframe_bytes_max = 4096\n")).unwrap();
    parse(&with("", "[limits]\nframe_bytes_max = 67108864\n")).unwrap();
}

#[test]
fn other_limits_are_checked() {
    for (field, key) in [
        ("limits.watch_streams_max", "[limits]\nwatch_streams_max"),
        (
            "limits.watch_catch_up_wait_ms",
            "[limits]\nwatch_catch_up_wait_ms",
        ),
        ("limits.write_batch_max", "[limits]\nwrite_batch_max"),
        ("limits.request_timeout_ms", "[limits]\nrequest_timeout_ms"),
        (
            "limits.slow_consumer_timeout_ms",
            "[limits]\nslow_consumer_timeout_ms",
        ),
        (
            "watch.progress_interval_ms",
            "[watch]\nprogress_interval_ms",
        ),
        ("watch.sync_page_resources", "[watch]\nsync_page_resources"),
        ("compaction.retention_ms", "[compaction]\nretention_ms"),
        (
            "compaction.request_retention_ms",
            "[compaction]\nrequest_retention_ms",
        ),
        ("compaction.interval_ms", "[compaction]\ninterval_ms"),
        ("compaction.batch_rows_max", "[compaction]\nbatch_rows_max"),
        (
            "compaction.cutoff_step_max_ms",
            "[compaction]\ncutoff_step_max_ms",
        ),
    ] {
        assert_invalid(&with("", &format!("{key} = 0\n")), field, "(got 0)");
    }
}

#[test]
fn unknown_fields_are_named() {
    let error = parse(&with("bogus = 1", "")).unwrap_err();
    assert!(matches!(error, ConfigError::Parse { .. }));
    assert_eq!(error.field(), Some("bogus"));
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("{PATH}: field \"bogus\": ")),
        "{shown}"
    );
    assert!(shown.contains("unknown field `bogus`"), "{shown}");
    assert!(shown.contains("line 1, column 1"), "{shown}");

    let error = parse(&with("", "[raft]\nheartbeat_ms = 5\n")).unwrap_err();
    assert_eq!(error.field(), Some("raft.heartbeat_ms"), "{error}");
    let error = parse(&with(
        "",
        "[[peers]]\nnode_id = 2\naddr = \"10.0.0.2:1\"\nport = 3\n",
    ))
    .unwrap_err();
    assert_eq!(error.field(), Some("peers[0].port"), "{error}");
}

#[test]
fn wrong_types_are_named() {
    let error = parse(&MINIMAL.replace("node_id = 1", "node_id = \"one\"")).unwrap_err();
    assert_eq!(error.field(), Some("node_id"), "{error}");
    assert!(error.to_string().contains("invalid type"), "{error}");
    let error = parse(&with("listen_addr = \"localhost\"", "")).unwrap_err();
    assert_eq!(error.field(), Some("listen_addr"), "{error}");
    let error = parse(&with("", "[limits]\nframe_bytes_max = -1\n")).unwrap_err();
    assert_eq!(error.field(), Some("limits.frame_bytes_max"), "{error}");
}

#[test]
fn syntax_error_names_the_file() {
    let error = parse("node_id = = 1\n").unwrap_err();
    assert!(matches!(error, ConfigError::Parse { .. }));
    let shown = error.to_string();
    assert!(shown.starts_with(&format!("{PATH}: ")), "{shown}");
    assert!(shown.contains("line 1, column"), "{shown}");
}

#[test]
fn load_resolves_relative_paths_against_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let conf_dir = dir.path().join("etc");
    std::fs::create_dir(&conf_dir).unwrap();
    let path = conf_dir.join("node.toml");
    let text = "node_id = 1\n\
                [tls]\n\
                ca_cert = \"certs/ca.pem\"\n\
                cert = \"../certs/node-1.pem\"\n\
                key = \"/abs/node-1.key\"\n";
    std::fs::write(&path, text).unwrap();
    let config = NodeConfig::load(&path).unwrap();
    assert_eq!(config.data_dir, conf_dir.join("./ctrl-data"));
    assert_eq!(config.tls.ca_cert, conf_dir.join("certs/ca.pem"));
    assert_eq!(config.tls.cert, conf_dir.join("../certs/node-1.pem"));
    assert_eq!(config.tls.key, Path::new("/abs/node-1.key"));
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let error = NodeConfig::load(&path).unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }));
    assert!(error.to_string().starts_with(&path.display().to_string()));
    std::fs::write(&path, with("", "[raft]\nheartbeat_interval_ms = 0\n")).unwrap();
    let error = NodeConfig::load(&path).unwrap_err();
    assert_eq!(error.path(), path);
    assert_eq!(error.field(), Some("raft.heartbeat_interval_ms"));
}

#[test]
fn odd_inputs_do_not_panic() {
    for text in [
        "",
        "\u{0}",
        "node_id = 18446744073709551615",
        "node_id = 9223372036854775807\n[tls]\nca_cert=\"a\"\ncert=\"b\"\nkey=\"c\"",
        "[[peers]]\n[[peers]]",
        "peers = 3",
        "tls = []",
        "[tls.ca_cert]",
        "a.b.c.d.e = 1",
        &"[".repeat(10_000),
        &"a = [".repeat(10_000),
        &"x = {".repeat(10_000),
    ] {
        let _ = parse(text).map(|config| config.to_toml_string());
    }
}
