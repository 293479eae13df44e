//! Tests of `wire/src/workload`.

use super::*;

fn spec() -> WorkloadSpec {
    WorkloadSpec {
        port: Some(8080),
        command: vec!["/app/server".into()],
        args: vec!["--listen".into(), ":8080".into()],
        health: Some(HealthCheck::new(Probe::Http {
            path: "/healthz".into(),
            port: None,
        })),
        shutdown_signal: Some("SIGQUIT".into()),
        termination_grace_s: Some(45),
        pod_labels: BTreeMap::from([("team".into(), "payments".into())]),
        pod_annotations: BTreeMap::from([("prometheus.io/scrape".into(), "true".into())]),
        secret_env: BTreeMap::from([(
            "DATABASE_URL".into(),
            SecretValue::Plain("postgres://u:p@db/x".into()),
        )]),
    }
}

fn error(spec: &WorkloadSpec) -> String {
    spec.validate(&BTreeMap::new()).unwrap_err().message
}

#[test]
fn the_default_and_a_full_spec_are_valid() {
    WorkloadSpec::default().validate(&BTreeMap::new()).unwrap();
    spec().validate(&BTreeMap::new()).unwrap();
}

#[test]
fn each_bad_field_is_named() {
    type Change = Box<dyn Fn(&mut WorkloadSpec)>;
    let cases: Vec<(&str, Change)> = vec![
        ("port", Box::new(|s| s.port = Some(0))),
        ("health.port is needed", Box::new(|s| s.port = None)),
        (
            "health.path",
            Box::new(|s| {
                s.health = Some(HealthCheck::new(Probe::Http {
                    path: "healthz".into(),
                    port: None,
                }))
            }),
        ),
        (
            "health.command",
            Box::new(|s| s.health = Some(HealthCheck::new(Probe::Exec { command: vec![] }))),
        ),
        (
            "health.period_s",
            Box::new(|s| s.health.as_mut().unwrap().period_s = 0),
        ),
        (
            "health.timeout_s",
            Box::new(|s| s.health.as_mut().unwrap().timeout_s = PROBE_SECONDS_MAX + 1),
        ),
        (
            "health.failure_threshold",
            Box::new(|s| s.health.as_mut().unwrap().failure_threshold = 0),
        ),
        (
            "shutdown_signal",
            Box::new(|s| s.shutdown_signal = Some("QUIT".into())),
        ),
        (
            "termination_grace_s",
            Box::new(|s| s.termination_grace_s = Some(TERMINATION_GRACE_S_MAX + 1)),
        ),
        (
            "command",
            Box::new(|s| s.command = vec!["x".into(); COMMAND_ARGS_MAX + 1]),
        ),
        (
            "args",
            Box::new(|s| s.args = vec!["x".repeat(COMMAND_ARG_BYTES_MAX + 1)]),
        ),
        (
            "pod_labels key \"unkey.com/deployment.id\" is krane's own",
            Box::new(|s| {
                s.pod_labels
                    .insert("unkey.com/deployment.id".into(), "x".into());
            }),
        ),
        (
            "pod_labels key \"app.kubernetes.io/managed-by\" is krane's own",
            Box::new(|s| {
                s.pod_labels
                    .insert("app.kubernetes.io/managed-by".into(), "me".into());
            }),
        ),
        (
            "pod_labels key \"-bad\"",
            Box::new(|s| {
                s.pod_labels.insert("-bad".into(), "x".into());
            }),
        ),
        (
            "pod_labels value",
            Box::new(|s| {
                s.pod_labels.insert("team".into(), "a b".into());
            }),
        ),
        (
            "pod_annotations key",
            Box::new(|s| {
                s.pod_annotations.insert("Bad_Prefix/x".into(), "y".into());
            }),
        ),
        (
            "pod_annotations are larger",
            Box::new(|s| {
                s.pod_annotations
                    .insert("big".into(), "x".repeat(ANNOTATIONS_BYTES_MAX));
            }),
        ),
        (
            "secret_env name",
            Box::new(|s| {
                s.secret_env
                    .insert("A B".into(), SecretValue::Plain("x".into()));
            }),
        ),
        (
            "secret_env BIG is longer",
            Box::new(|s| {
                s.secret_env.insert(
                    "BIG".into(),
                    SecretValue::Plain("x".repeat(SECRET_VALUE_BYTES_MAX + 1)),
                );
            }),
        ),
        (
            "secret_env S is not a well-formed sealed value",
            Box::new(|s| {
                s.secret_env.insert(
                    "S".into(),
                    SecretValue::Sealed(SealedSecret {
                        key_id: "k1".into(),
                        nonce: vec![0; 3],
                        ciphertext: vec![],
                    }),
                );
            }),
        ),
    ];
    for (want, change) in cases {
        let mut s = spec();
        change(&mut s);
        let message = error(&s);
        assert!(message.contains(want), "want {want:?} in {message:?}");
    }
}

#[test]
fn a_secret_may_not_shadow_a_plain_variable() {
    let env = BTreeMap::from([("DATABASE_URL".to_string(), "x".to_string())]);
    let message = spec().validate(&env).unwrap_err().message;
    assert!(message.contains("secret_env DATABASE_URL"), "{message}");
}

#[test]
fn an_http_probe_may_name_its_own_port() {
    let mut s = spec();
    s.port = None;
    s.health = Some(HealthCheck::new(Probe::Http {
        path: "/ready".into(),
        port: Some(9090),
    }));
    s.validate(&BTreeMap::new()).unwrap();
}

#[test]
fn json_shows_names_only() {
    let mut s = spec();
    s.secret_env.insert(
        "SEALED".into(),
        SecretValue::Sealed(SealedSecret {
            key_id: "k1".into(),
            nonce: vec![7; SEALED_NONCE_BYTES],
            ciphertext: b"opaque".to_vec(),
        }),
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["secret_env"]["DATABASE_URL"], "<redacted>");
    assert_eq!(json["secret_env"]["SEALED"], "<sealed by k1>");
    // The binary encoding round-trips whole.
    let bytes = postcard::to_allocvec(&s).unwrap();
    assert_eq!(postcard::from_bytes::<WorkloadSpec>(&bytes).unwrap(), s);
}

#[test]
fn debug_never_shows_a_secret_value() {
    let mut s = spec();
    s.secret_env.insert(
        "SEALED".into(),
        SecretValue::Sealed(SealedSecret {
            key_id: "k1".into(),
            nonce: vec![7; SEALED_NONCE_BYTES],
            ciphertext: b"opaque-bytes".to_vec(),
        }),
    );
    let shown = format!("{s:?} {s:#?}");
    assert!(!shown.contains("postgres://"), "{shown}");
    assert!(shown.contains("DATABASE_URL"), "names are shown");
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(
        !shown.contains("111"),
        "no bytes of the ciphertext: {shown}"
    );
}
