//! Kubernetes names of the objects krane makes for ctrl's resources.
//! Deterministic, so every replica (and krane) computes the same name.

/// Longest Kubernetes object name that is also a DNS label.
const K8S_NAME_BYTES_MAX: usize = 63;

/// The Kubernetes name of a deployment's objects: `dep-<id>`, lowercased,
/// every character outside `[a-z0-9-]` replaced by `-`, cut to 63 bytes,
/// trailing dashes removed (a DNS-1035 label). Deterministic, so every
/// replica and krane agree.
pub fn deployment_k8s_name(deployment_id: &str) -> String {
    prefixed_k8s_name("dep", deployment_id)
}

/// The Kubernetes name of a sentinel's objects: `snt-<id>`, made a DNS
/// label as [`deployment_k8s_name`].
pub fn sentinel_k8s_name(sentinel_id: &str) -> String {
    prefixed_k8s_name("snt", sentinel_id)
}

/// The namespace sentinels run in.
pub const SENTINEL_NAMESPACE: &str = "sentinel";

fn prefixed_k8s_name(prefix: &str, id: &str) -> String {
    let mut out = format!("{prefix}-");
    // Ids minted by ctrl already carry the prefix (`dep_…`).
    let bare = id
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(['_', '-']))
        .unwrap_or(id);
    for c in bare.chars() {
        if out.len() >= K8S_NAME_BYTES_MAX {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k8s_names_are_dns_labels() {
        assert_eq!(deployment_k8s_name("Dep_01.X"), "dep-dep-01-x");
        assert_eq!(
            deployment_k8s_name("dep_20yysmkk16yj3"),
            "dep-20yysmkk16yj3"
        );
        assert_eq!(deployment_k8s_name("é"), "dep");
        let long = deployment_k8s_name(&"a".repeat(100));
        assert_eq!(long.len(), K8S_NAME_BYTES_MAX);
        assert!(long.starts_with("dep-aaa"));
        assert_eq!(
            deployment_k8s_name(&format!("{}-b", "a".repeat(58))).len(),
            62
        );
    }
}
