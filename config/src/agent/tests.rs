//! Tests of `config/src/agent`.

use super::*;

const PATH: &str = "/etc/krane/agent.toml";

const MINIMAL: &str = r#"
region = "us-east"
endpoints = ["10.0.0.11:7400", "ctrl-1.ctrl.svc:7400"]

[tls]
ca_cert = "/etc/krane/ca.pem"
cert = "/etc/krane/agent-us-east.pem"
key = "/etc/krane/agent-us-east.key"
"#;

fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
    AgentConfig::from_toml_str(text, Path::new(PATH))
}

/// The minimal file with `extra` top-level keys added before `[tls]`.
fn with(extra: &str) -> String {
    format!("{extra}\n{MINIMAL}")
}

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

fn sample() -> AgentConfig {
    AgentConfig::new(
        "us-east",
        vec![
            "10.0.0.11:7400".parse().unwrap(),
            "[fd00::1]:7400".parse().unwrap(),
        ],
        TlsFiles::in_dir(Path::new("/etc/krane"), "agent-us-east"),
    )
}

#[test]
fn metrics_addr_is_optional_and_checked() {
    assert_eq!(parse(MINIMAL).unwrap().metrics_addr, None);
    let config = parse(&with("metrics_addr = \"0.0.0.0:9400\"")).unwrap();
    assert_eq!(config.metrics_addr, Some("0.0.0.0:9400".parse().unwrap()));
    assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    let error = parse(&with("metrics_addr = \"9400\"")).unwrap_err();
    assert_eq!(error.field(), Some("metrics_addr"), "{error}");
}

#[test]
fn defaults_round_trip() {
    let config = sample();
    config.validate(Path::new(PATH)).unwrap();
    assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
    let mut config = sample();
    config.kubeconfig = Some(PathBuf::from("/root/.kube/config"));
    config
        .endpoints
        .push("ctrl-2.ctrl.svc:7400".parse().unwrap());
    assert_eq!(parse(&config.to_toml_string()).unwrap(), config);
}

#[test]
fn minimal_file_gets_defaults() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.region, "us-east");
    assert_eq!(config.endpoints.len(), 2);
    assert_eq!(config.endpoints[1].host(), "ctrl-1.ctrl.svc");
    assert_eq!(config.server_name, "ctrl.local");
    assert_eq!(config.kubeconfig, None);
    assert_eq!(config.namespace, "krane");
    assert_eq!(config.data_dir, Path::new("./krane-data"));
    assert_eq!(config.reconnect_backoff_min_ms, 1_000);
    assert_eq!(config.reconnect_backoff_max_ms, 5_000);
    assert_eq!(config.full_resync_interval_ms, 300_000);
    assert_eq!(config.report_batch_max, 256);
    assert_eq!(config.heartbeat_interval_ms, 30_000);
}

#[test]
fn region_must_be_a_lowercase_dns_label() {
    for region in ["US-East", "", "-a", "us_east", "us.east"] {
        let text = MINIMAL.replace("\"us-east\"", &format!("{region:?}"));
        assert_invalid(&text, "region", "lowercase DNS label");
    }
}

#[test]
fn empty_endpoints_rejected() {
    let text = MINIMAL.replace("[\"10.0.0.11:7400\", \"ctrl-1.ctrl.svc:7400\"]", "[]");
    assert_invalid(&text, "endpoints", "at least one");
}

#[test]
fn bad_endpoint_is_named() {
    let text = MINIMAL.replace("ctrl-1.ctrl.svc:7400", "ctrl-1.ctrl.svc");
    let error = parse(&text).unwrap_err();
    assert_eq!(error.field(), Some("endpoints[1]"), "{error}");
    assert!(error.to_string().starts_with(PATH), "{error}");
    assert!(error.to_string().contains("expected host:port"), "{error}");
}

#[test]
fn duplicate_and_unusable_endpoints_rejected() {
    let mut config = sample();
    config.endpoints.push("10.0.0.11:7400".parse().unwrap());
    let error = config.validate(Path::new(PATH)).unwrap_err();
    assert_eq!(error.field(), Some("endpoints[2]"), "{error}");
    let mut config = sample();
    config.endpoints[0] = Endpoint::from("0.0.0.0:7400".parse::<std::net::SocketAddr>().unwrap());
    let error = config.validate(Path::new(PATH)).unwrap_err();
    assert_eq!(error.field(), Some("endpoints[0]"), "{error}");
}

#[test]
fn server_name_is_checked() {
    assert_invalid(
        &with("server_name = \"not a name\""),
        "server_name",
        "DNS name",
    );
    parse(&with("server_name = \"10.0.0.1\"")).unwrap();
}

#[test]
fn namespace_is_checked() {
    assert_invalid(
        &with("namespace = \"Krane\""),
        "namespace",
        "lowercase DNS label",
    );
}

#[test]
fn paths_are_checked() {
    assert_invalid(
        &with("kubeconfig = \"\""),
        "kubeconfig",
        "must not be empty",
    );
    assert_invalid(&with("data_dir = \"\""), "data_dir", "must not be empty");
    let text = MINIMAL.replace("/etc/krane/ca.pem", "");
    assert_invalid(&text, "tls.ca_cert", "must not be empty");
}

#[test]
fn backoff_max_must_be_at_least_min() {
    let text = with("reconnect_backoff_min_ms = 2000\nreconnect_backoff_max_ms = 1000");
    assert_invalid(
        &text,
        "reconnect_backoff_max_ms",
        "must be at least reconnect_backoff_min_ms (got 1000 < 2000)",
    );
    parse(&with(
        "reconnect_backoff_min_ms = 2000\nreconnect_backoff_max_ms = 2000",
    ))
    .unwrap();
}

#[test]
fn durations_and_batches_are_checked() {
    for field in [
        "reconnect_backoff_min_ms",
        "reconnect_backoff_max_ms",
        "full_resync_interval_ms",
        "report_batch_max",
        "max_concurrent_applies",
    ] {
        assert_invalid(&with(&format!("{field} = 0")), field, "(got 0)");
    }
    assert_invalid(
        &with("max_concurrent_applies = 257"),
        "max_concurrent_applies",
        "(got 257)",
    );
    for bad in [99, 600_001] {
        assert_invalid(
            &with(&format!("heartbeat_interval_ms = {bad}")),
            "heartbeat_interval_ms",
            &format!("(got {bad})"),
        );
    }
    parse(&with("heartbeat_interval_ms = 100")).unwrap();
}

#[test]
fn unknown_field_is_named() {
    let error = parse(&with("regoin = \"x\"")).unwrap_err();
    assert_eq!(error.field(), Some("regoin"), "{error}");
    assert!(
        error.to_string().contains("unknown field `regoin`"),
        "{error}"
    );
}

#[test]
fn load_resolves_relative_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    let text = with("kubeconfig = \"kube/config\"").replace("/etc/krane/", "certs/");
    std::fs::write(&path, text).unwrap();
    let config = AgentConfig::load(&path).unwrap();
    assert_eq!(config.kubeconfig, Some(dir.path().join("kube/config")));
    assert_eq!(config.data_dir, dir.path().join("krane-data"));
    assert_eq!(config.tls.ca_cert, dir.path().join("certs/ca.pem"));
    assert_eq!(config.tls.cert, dir.path().join("certs/agent-us-east.pem"));
    assert_eq!(config.tls.key, dir.path().join("certs/agent-us-east.key"));
}
