//! Kubernetes naming, a contract between ctrl and krane: the names ctrl
//! gives a resource's Kubernetes objects (stored in the resource, and
//! derived again by krane for a resource it only knows by id), the
//! namespace sentinels run in, the labels krane puts on every object (and
//! the policies ctrl writes select pods by), and the checks of names an
//! operator sends.
//!
//! Kubernetes has two name shapes: a DNS label (RFC 1123/1035: at most
//! [`DNS_LABEL_BYTES_MAX`] bytes of `[a-z0-9-]`, used for namespaces and
//! services) and a DNS subdomain (at most [`DNS_SUBDOMAIN_BYTES_MAX`] bytes,
//! dots allowed, used for most other objects).

use crate::error::{ErrorCode, WireError};

/// Longest DNS label: a namespace, a service, or any name ctrl derives.
pub const DNS_LABEL_BYTES_MAX: usize = 63;
/// Longest DNS subdomain: the longest name of most Kubernetes objects.
pub const DNS_SUBDOMAIN_BYTES_MAX: usize = 253;

/// The namespace sentinels run in.
pub const SENTINEL_NAMESPACE: &str = "sentinel";

/// The label every object krane creates carries, with value
/// [`MANAGED_BY_VALUE`]; objects without it are never changed or deleted.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on krane's objects.
pub const MANAGED_BY_VALUE: &str = "krane";
/// `managed-by=krane`, as a label selector.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=krane";
/// Label: the deployment an object belongs to.
pub const DEPLOYMENT_ID_LABEL: &str = "unkey.com/deployment.id";
/// Label: the owning workspace.
pub const WORKSPACE_ID_LABEL: &str = "unkey.com/workspace.id";
/// Label: the owning project.
pub const PROJECT_ID_LABEL: &str = "unkey.com/project.id";
/// Label: the environment.
pub const ENVIRONMENT_ID_LABEL: &str = "unkey.com/environment.id";
/// Label: the app a sentinel fronts.
pub const APP_ID_LABEL: &str = "unkey.com/app.id";
/// Label: the sentinel an object belongs to.
pub const SENTINEL_ID_LABEL: &str = "unkey.com/sentinel.id";
/// Label: the cilium policy an object realises.
pub const POLICY_ID_LABEL: &str = "unkey.com/cilium-network-policy.id";
/// `app.kubernetes.io/component`: what part of the product an object is.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The label Cilium gives every endpoint: its pod's namespace (policies
/// select pods of another namespace by it).
pub const POD_NAMESPACE_LABEL: &str = "k8s:io.kubernetes.pod.namespace";
/// Longest label value Kubernetes accepts.
pub const LABEL_VALUE_BYTES_MAX: usize = 63;
/// The Kubernetes name of a deployment's objects: `dep-<id>`, lowercased,
/// every character outside `[a-z0-9-]` replaced by `-`, cut to
/// [`DNS_LABEL_BYTES_MAX`] bytes, trailing dashes removed (a DNS-1035
/// label). Deterministic, so every replica and krane agree.
pub fn deployment(deployment_id: &str) -> String {
    prefixed("dep", deployment_id)
}

/// The Kubernetes name of a sentinel's objects: `snt-<id>`, made a DNS
/// label as [`deployment`].
pub fn sentinel(sentinel_id: &str) -> String {
    prefixed("snt", sentinel_id)
}

/// The name of a sentinel's routes ConfigMap and of the Role that lets
/// the sentinel read it (in the sentinel's namespace): its Kubernetes name
/// (`snt-<id>`) with a `-routes` suffix, kept a DNS label.
pub fn sentinel_routes(sentinel_k8s_name: &str) -> String {
    with_suffix(sentinel_k8s_name, "-routes")
}

/// `name` cut so that `name` + `suffix` is a DNS label, without a dash
/// left at the cut, then `suffix`.
fn with_suffix(name: &str, suffix: &str) -> String {
    let mut name = name.to_string();
    name.truncate(DNS_LABEL_BYTES_MAX - suffix.len());
    let mut name = name.trim_end_matches('-').to_string();
    name.push_str(suffix);
    name
}

/// The name of a sentinel's served ConfigMap (in the sentinel's
/// namespace), where each of its pods writes the route generation it
/// serves ([`crate::routes::ServedEntry`]): its Kubernetes name with a
/// `-served` suffix, kept a DNS label.
pub fn sentinel_served(sentinel_k8s_name: &str) -> String {
    with_suffix(sentinel_k8s_name, "-served")
}

/// The id of a deployment's ingress policy (one per region, in the
/// deployment's namespace): the deployment's Kubernetes name with a `-net`
/// suffix, kept a DNS label.
pub fn deployment_policy(deployment_id: &str) -> String {
    suffixed(deployment_id, "-net")
}

/// The id of a deployment's egress policy (one per region, in the
/// sentinels' namespace: lets the environment's sentinel reach the
/// deployment): its Kubernetes name with an `-egress` suffix.
pub fn deployment_egress_policy(deployment_id: &str) -> String {
    suffixed(deployment_id, "-egress")
}

fn suffixed(deployment_id: &str, suffix: &str) -> String {
    let mut name = deployment(deployment_id);
    name.truncate(DNS_LABEL_BYTES_MAX - suffix.len());
    let mut name = name.trim_end_matches('-').to_string();
    name.push_str(suffix);
    name
}

/// `value` made a valid label value: characters outside `[A-Za-z0-9._-]`
/// become `-`, at most [`LABEL_VALUE_BYTES_MAX`] bytes, starting and
/// ending with an alphanumeric character (empty if none is left).
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(LABEL_VALUE_BYTES_MAX)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

fn prefixed(prefix: &str, id: &str) -> String {
    let mut out = format!("{prefix}-");
    // Ids minted by ctrl already carry the prefix (`dep_…`).
    let bare = id
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(['_', '-']))
        .unwrap_or(id);
    for c in bare.chars() {
        if out.len() >= DNS_LABEL_BYTES_MAX {
            break;
        }
        let c = c.to_ascii_lowercase();
        out.push(if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        });
    }
    let trimmed = out.trim_end_matches('-').len();
    out.truncate(trimmed);
    out
}

/// Checks that `value` (the field `field`) is a DNS label: `[a-z0-9-]`,
/// starting and ending alphanumeric, at most [`DNS_LABEL_BYTES_MAX`] bytes.
/// The error names the field.
pub fn validate_dns_label(field: &str, value: &str) -> Result<(), WireError> {
    validate(field, value, DNS_LABEL_BYTES_MAX, false)
}

/// Checks that `value` (the field `field`) is a DNS subdomain: as a label,
/// '.' allowed too, at most [`DNS_SUBDOMAIN_BYTES_MAX`] bytes. The error
/// names the field.
pub fn validate_dns_subdomain(field: &str, value: &str) -> Result<(), WireError> {
    validate(field, value, DNS_SUBDOMAIN_BYTES_MAX, true)
}

fn validate(field: &str, value: &str, bytes_max: usize, dots: bool) -> Result<(), WireError> {
    let ok = !value.is_empty()
        && value.len() <= bytes_max
        && value.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        })
        // Each dot-separated label starts and ends alphanumeric.
        && value.split('.').all(|label| {
            label.starts_with(|c: char| c.is_ascii_alphanumeric())
                && label.ends_with(|c: char| c.is_ascii_alphanumeric())
        });
    if ok {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "{field} {value:?} is not a Kubernetes name (a-z, 0-9, '-'{}, at most {bytes_max})",
                if dots { ", '.'" } else { "" }
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_are_dns_labels() {
        assert_eq!(deployment("Dep_01.X"), "dep-dep-01-x");
        assert_eq!(deployment("dep_20yysmkk16yj3"), "dep-20yysmkk16yj3");
        assert_eq!(deployment("é"), "dep");
        let long = deployment(&"a".repeat(100));
        assert_eq!(long.len(), DNS_LABEL_BYTES_MAX);
        assert!(long.starts_with("dep-aaa"));
        assert_eq!(deployment(&format!("{}-b", "a".repeat(58))).len(), 62);
        assert_eq!(sentinel("snt_01ABC"), "snt-01abc");
        assert_eq!(sentinel("x.y"), "snt-x-y");
        assert_eq!(sentinel_routes("snt-a"), "snt-a-routes");
        assert_eq!(sentinel_served("snt-a"), "snt-a-served");
        let long = sentinel(&"Z".repeat(99));
        for name in [
            deployment("Dep_01.X"),
            long.clone(),
            sentinel_routes(&long),
            sentinel_served(&long),
        ] {
            validate_dns_label("name", &name).unwrap();
        }
    }

    #[test]
    fn labels_and_subdomains_are_checked() {
        validate_dns_label("namespace", "krane-1").unwrap();
        validate_dns_label("namespace", &"a".repeat(DNS_LABEL_BYTES_MAX)).unwrap();
        validate_dns_subdomain("name", "allow.env-1").unwrap();
        validate_dns_subdomain("name", &"a".repeat(DNS_SUBDOMAIN_BYTES_MAX)).unwrap();
        for bad in [
            String::new(),
            "a.b".into(),
            "-a".into(),
            "a-".into(),
            "A".into(),
            "a".repeat(DNS_LABEL_BYTES_MAX + 1),
        ] {
            let error = validate_dns_label("namespace", &bad).expect_err(&bad);
            assert_eq!(error.code, ErrorCode::BadRequest);
            assert!(error.message.contains("namespace"), "{}", error.message);
        }
        for bad in [
            ".a".into(),
            "a_b".into(),
            "a..b".into(),
            "a-.b".into(),
            "a.-b".into(),
            "a".repeat(DNS_SUBDOMAIN_BYTES_MAX + 1),
        ] {
            let error = validate_dns_subdomain("name", &bad).expect_err(&bad);
            assert!(error.message.contains("name"), "{}", error.message);
        }
    }
}
