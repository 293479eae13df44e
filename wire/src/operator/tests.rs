//! The checks of operator requests: each refusal names its field.

use super::*;
use crate::error::ErrorCode;
use crate::validate;

fn sentinel() -> ApplySentinel {
    ApplySentinel {
        workspace_id: "ws_1".into(),
        project_id: "proj_1".into(),
        app_id: "app_1".into(),
        environment_id: "env_1".into(),
        region: "us-east".into(),
        image: Some("sentinel:1".into()),
        replicas: Some(2),
        cpu_millicores: None,
        memory_mib: None,
        deadline_ms: None,
    }
}

fn policy() -> ApplyPolicy {
    ApplyPolicy {
        workspace_id: "ws_1".into(),
        environment_id: "env_1".into(),
        region: "us-east".into(),
        name: "allow-env-1".into(),
        namespace: "krane".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
    }
}

/// A field and a way to make it invalid.
type Spoil<T> = (&'static str, fn(&mut T));

fn message(result: Result<(), WireError>) -> String {
    let error = result.expect_err("refused");
    assert_eq!(error.code, ErrorCode::BadRequest);
    error.message
}

#[test]
fn apply_sentinel_errors_name_the_field() {
    sentinel().validate().unwrap();
    let cases: [Spoil<ApplySentinel>; 12] = [
        ("workspace_id", |s| s.workspace_id.clear()),
        ("project_id", |s| s.project_id.clear()),
        ("app_id", |s| s.app_id = "a".repeat(NAME_BYTES_MAX + 1)),
        ("environment_id", |s| s.environment_id.clear()),
        ("region", |s| s.region = "US_EAST".into()),
        ("image", |s| s.image = Some("a b".into())),
        ("image", |s| s.image = Some("Sentinel:1".into())),
        ("deadline_ms", |s| s.deadline_ms = Some(0)),
        ("replicas", |s| s.replicas = Some(0)),
        ("cpu_millicores", |s| s.cpu_millicores = Some(0)),
        ("memory_mib", |s| s.memory_mib = Some(0)),
        ("cpu_millicores", |s| {
            s.cpu_millicores = Some(validate::CPU_MILLICORES_MAX + 1)
        }),
    ];
    for (field, spoil) in cases {
        let mut request = sentinel();
        spoil(&mut request);
        let message = message(request.validate());
        assert!(message.contains(field), "{field}: {message}");
    }
    let mut request = sentinel();
    request.replicas = Some(REPLICAS_MAX + 1);
    assert!(message(request.validate()).contains("replicas"));
    request.replicas = None;
    request.validate().unwrap();
}

#[test]
fn create_deployment_refuses_what_kubernetes_would() {
    let valid = || CreateDeployment {
        spec: Box::default(),
        ..crate::golden::fixtures::create_deployment()
    };
    valid().validate().unwrap();
    let cases: [Spoil<CreateDeployment>; 5] = [
        (
            "env_vars \"1X\" is not a valid environment variable name",
            |c| {
                c.env_vars.insert("1X".into(), "v".into());
            },
        ),
        (
            "env_vars \"A B\" is not a valid environment variable name",
            |c| {
                c.env_vars.insert("A B".into(), "v".into());
            },
        ),
        ("image \"Shop:1\" is not an image reference", |c| {
            c.image = "Shop:1".into();
        }),
        ("cpu_millicores must be between 1 and", |c| {
            c.cpu_millicores = 0
        }),
        ("memory_mib must be between 1 and", |c| {
            c.memory_mib = validate::MEMORY_MIB_MAX + 1;
        }),
    ];
    for (says, spoil) in cases {
        let mut request = valid();
        spoil(&mut request);
        let message = message(request.validate());
        assert!(message.starts_with(says), "{says}: {message}");
    }
}

#[test]
fn a_request_id_is_short_printable_ascii() {
    for good in [
        "a",
        "cli-0123abcd",
        "x".repeat(REQUEST_ID_BYTES_MAX).as_str(),
        "!~",
    ] {
        assert_eq!(RequestId::parse(good).unwrap().as_str(), good);
    }
    let too_long = "x".repeat(REQUEST_ID_BYTES_MAX + 1);
    for (bad, says) in [
        ("", "empty"),
        (too_long.as_str(), "longer than"),
        ("a b", "printable"),
        ("tab\t", "printable"),
        ("grüße", "printable"),
    ] {
        let message = message(RequestId::parse(bad).map(|_| ()));
        assert!(message.contains(says), "{bad:?}: {message}");
    }
}

#[test]
fn apply_policy_errors_name_the_field() {
    policy().validate().unwrap();
    let cases: [Spoil<ApplyPolicy>; 11] = [
        ("workspace_id", |p| p.workspace_id.clear()),
        ("environment_id", |p| p.environment_id.clear()),
        ("region", |p| p.region.clear()),
        ("name", |p| p.name = "Allow".into()),
        ("name", |p| p.name = "-allow".into()),
        ("namespace", |p| p.namespace = "a.b".into()),
        ("policy_json", |p| p.policy_json = " ".into()),
        ("policy_json", |p| p.policy_json = "{".into()),
        ("policy_json", |p| p.policy_json = "{}".into()),
        ("policy_json", |p| {
            p.policy_json = r#"{"ingress":[]}"#.into()
        }),
        ("policy_json", |p| {
            p.policy_json = "x".repeat(POLICY_JSON_BYTES_MAX + 1)
        }),
    ];
    for (field, spoil) in cases {
        let mut request = policy();
        spoil(&mut request);
        let message = message(request.validate());
        assert!(message.contains(field), "{field}: {message}");
    }
    let mut request = policy();
    request.name = "allow.env-1".into();
    request.validate().unwrap();
}
