//! What a real API server refuses on a write, refused here with its
//! `422 Invalid` Status (a field and a message): label keys and values,
//! container environment variable names, and a `CiliumNetworkPolicy`
//! rule without `endpointSelector` or `nodeSelector` (Cilium's CRD
//! schema). Everything else is accepted as before (see the crate's
//! simplifications).

use serde_json::Value;

use crate::resources::ResourceDef;
use crate::status::ApiError;

/// Longest label value and label name part, in bytes.
const LABEL_PART_BYTES_MAX: usize = 63;

/// Checks `object` (kind `res`, named `name`) as the API server would.
pub fn check(res: &ResourceDef, name: &str, object: &Value) -> Result<(), ApiError> {
    let invalid = |field: &str, why: &str| Err(ApiError::invalid(res, name, field, why));
    labels(&object["metadata"]["labels"], "metadata.labels")
        .map_or(Ok(()), |(f, why)| invalid(&f, &why))?;
    let pod_spec = match res.kind {
        "StatefulSet" | "Deployment" => {
            labels(
                &object["spec"]["template"]["metadata"]["labels"],
                "spec.template.metadata.labels",
            )
            .map_or(Ok(()), |(f, why)| invalid(&f, &why))?;
            Some((&object["spec"]["template"]["spec"], "spec.template.spec"))
        }
        "Pod" => Some((&object["spec"], "spec")),
        _ => None,
    };
    if let Some((spec, path)) = pod_spec
        && let Some((field, why)) = env_names(spec, path)
    {
        return invalid(&field, &why);
    }
    if res.kind == "CiliumNetworkPolicy" {
        let rules: Vec<(String, &Value)> = match (&object["spec"], &object["specs"]) {
            (Value::Null, Value::Array(specs)) => specs
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("specs[{i}]"), s))
                .collect(),
            (spec, _) => vec![("spec".to_string(), spec)],
        };
        for (field, rule) in rules {
            let selectors = ["endpointSelector", "nodeSelector"]
                .iter()
                .filter(|s| rule.get(**s).is_some_and(Value::is_object))
                .count();
            if selectors != 1 {
                return invalid(
                    &field,
                    "Invalid value: \"object\": exactly one of endpointSelector and nodeSelector is required",
                );
            }
        }
    }
    Ok(())
}

/// The first label whose key or value Kubernetes refuses: (field, why).
fn labels(labels: &Value, path: &str) -> Option<(String, String)> {
    let labels = labels.as_object()?;
    for (key, value) in labels {
        let name = key.rsplit_once('/').map_or(key.as_str(), |(_, n)| n);
        if !is_label_part(name, false) {
            return Some((
                path.to_string(),
                format!(
                    "Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        let value = value.as_str().unwrap_or("\u{0}");
        if !is_label_part(value, true) {
            return Some((
                format!("{path}.{key}"),
                format!(
                    "Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
    }
    None
}

fn is_label_part(text: &str, may_be_empty: bool) -> bool {
    if text.is_empty() {
        return may_be_empty;
    }
    text.len() <= LABEL_PART_BYTES_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The first environment variable name of a pod spec's containers that
/// Kubernetes refuses (`[-._a-zA-Z][-._a-zA-Z0-9]*`): (field, why).
fn env_names(spec: &Value, path: &str) -> Option<(String, String)> {
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec[list].as_array() else {
            continue;
        };
        for (c, container) in containers.iter().enumerate() {
            let Some(env) = container["env"].as_array() else {
                continue;
            };
            for (e, var) in env.iter().enumerate() {
                let name = var["name"].as_str().unwrap_or("");
                let mut bytes = name.bytes();
                let ok = bytes
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'))
                    && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
                if !ok {
                    return Some((
                        format!("{path}.{list}[{c}].env[{e}].name"),
                        format!(
                            "Invalid value: \"{name}\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit"
                        ),
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::find;

    #[test]
    fn refuses_what_an_api_server_refuses() {
        let sts = find("apps", "v1", "statefulsets").unwrap();
        let ok = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "krane"}},
            "spec": {"template": {"metadata": {"labels": {"a": ""}}, "spec": {"containers": [
                {"name": "app", "env": [{"name": "LOG_LEVEL", "value": "x"}]}]}}}});
        check(sts, "web", &ok).unwrap();
        let bad_env = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "app", "env": [{"name": "OK"}, {"name": "1X"}]}]}}}});
        let e = check(sts, "web", &bad_env).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.starts_with(
                "StatefulSet \"web\" is invalid: spec.template.spec.containers[0].env[1].name: Invalid value: \"1X\""
            ),
            "{}",
            e.message
        );
        let bad_label = json!({"metadata": {"labels": {"a": "-x"}}});
        assert_eq!(check(sts, "web", &bad_label).unwrap_err().code, 422);
        let cnp = find("cilium.io", "v2", "ciliumnetworkpolicies").unwrap();
        check(cnp, "p", &json!({"spec": {"endpointSelector": {}}})).unwrap();
        check(cnp, "p", &json!({"specs": [{"nodeSelector": {}}]})).unwrap();
        for bad in [
            json!({"spec": {}}),
            json!({"spec": {"ingress": []}}),
            json!({"specs": [{"endpointSelector": {}}, {}]}),
        ] {
            assert_eq!(check(cnp, "p", &bad).unwrap_err().code, 422, "{bad}");
        }
    }
}
