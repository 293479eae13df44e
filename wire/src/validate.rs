//! What Kubernetes (or Cilium) would refuse, refused where the user is:
//! pure checks of the strings a request carries into the objects krane
//! builds — environment variable names, image references, resource
//! quantities and the basic shape of a cilium policy document. Each error
//! is a `BadRequest` naming the field and saying what is expected, so
//! `ctrl` shows the operator what to fix before anything is written.
//! (Names and labels are checked by [`crate::k8s_name`] and
//! [`crate::workload`].)

use crate::error::{ErrorCode, WireError};

/// Longest image reference's name part (registry and path), in bytes, as
/// the docker reference grammar allows.
pub const IMAGE_NAME_BYTES_MAX: usize = 255;
/// Longest image tag, in bytes.
pub const IMAGE_TAG_BYTES_MAX: usize = 128;
/// Fewest hex digits of an image digest.
pub const IMAGE_DIGEST_HEX_MIN: usize = 32;
/// Most CPU one replica may ask for, in millicores (1,000 cores).
pub const CPU_MILLICORES_MAX: u32 = 1_000_000;
/// Most memory one replica may ask for, in MiB (4 TiB).
pub const MEMORY_MIB_MAX: u32 = 4 * 1024 * 1024;
/// Longest quantity string, in bytes.
pub const QUANTITY_BYTES_MAX: usize = 64;
/// Most rules of a cilium policy document in the `specs` list form.
pub const POLICY_SPECS_MAX: usize = 64;

fn bad(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// An environment variable name as Kubernetes checks it
/// (`[-._a-zA-Z][-._a-zA-Z0-9]*`, a C identifier with `-` and `.`).
pub fn env_var_name(field: &str, name: &str) -> Result<(), WireError> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'));
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(bad(format!(
            "{field} {name:?} is not a valid environment variable name: letters, digits, \
             '_', '-' and '.', not starting with a digit"
        )))
    }
}

/// An image reference by the docker reference grammar:
/// `[host[:port]/]path[:tag][@algorithm:hex]`, the path lowercase
/// components separated by `/` (`.`, `_`, `__` or dashes inside one), the
/// tag `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`, a digest of at least
/// [`IMAGE_DIGEST_HEX_MIN`] hex digits.
pub fn image_reference(field: &str, image: &str) -> Result<(), WireError> {
    let fail = |why: &str| {
        Err(bad(format!(
            "{field} {image:?} is not an image reference ({why}); e.g. \
             registry.local:5000/team/app:1.2@sha256:<64 hex>"
        )))
    };
    if image.is_empty() {
        return fail("it is empty");
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else {
            return fail("a digest is algorithm:hex");
        };
        let algorithm_ok = !algorithm.is_empty()
            && algorithm.split(['+', '.', '-', '_']).all(|c| {
                !c.is_empty()
                    && c.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        if !algorithm_ok {
            return fail("the digest's algorithm is lowercase letters and digits");
        }
        if hex.len() < IMAGE_DIGEST_HEX_MIN || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return fail("the digest is at least 32 hex digits");
        }
    }
    // The tag follows the last ':' after the last '/' (a ':' before it is
    // the registry's port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let mut bytes = tag.bytes();
        let ok = tag.len() <= IMAGE_TAG_BYTES_MAX
            && bytes
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return fail("a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'");
        }
    }
    if name.is_empty() {
        return fail("it has no name");
    }
    if name.len() > IMAGE_NAME_BYTES_MAX {
        return fail("the name is longer than 255 bytes");
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        let is_domain = first.contains(['.', ':'])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase());
        if is_domain {
            if !is_domain_part(first) {
                return fail("the registry is a host name or address with an optional :port");
            }
            components.remove(0);
        }
    }
    if !components.iter().all(|c| is_path_component(c)) {
        return fail(
            "each path component is lowercase letters and digits, separated by '.', '_', '__' or dashes",
        );
    }
    Ok(())
}

/// `host[:port]`: dot-separated components of `[A-Za-z0-9-]`, alphanumeric
/// at both ends, then optional digits after a `:`.
fn is_domain_part(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let host_ok = host.split('.').all(|c| {
        !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !c.starts_with('-')
            && !c.ends_with('-')
    });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// `[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*`.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: one '.', one '_', "__", or any dashes.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let ok = match &component[start..i] {
            "." | "_" | "__" => true,
            run => run.bytes().all(|b| b == b'-'),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// CPU per replica: 1 to [`CPU_MILLICORES_MAX`] millicores.
pub fn cpu_millicores(field: &str, value: u32) -> Result<(), WireError> {
    if value == 0 || value > CPU_MILLICORES_MAX {
        return Err(bad(format!(
            "{field} must be between 1 and {CPU_MILLICORES_MAX} (millicores), not {value}"
        )));
    }
    Ok(())
}

/// Memory per replica: 1 to [`MEMORY_MIB_MAX`] MiB.
pub fn memory_mib(field: &str, value: u32) -> Result<(), WireError> {
    if value == 0 || value > MEMORY_MIB_MAX {
        return Err(bad(format!(
            "{field} must be between 1 and {MEMORY_MIB_MAX} (MiB), not {value}"
        )));
    }
    Ok(())
}

/// A Kubernetes resource quantity (`250m`, `1.5`, `512Mi`, `2G`, `1e3`):
/// a non-negative decimal number and a suffix (`m`, `k`, `M`, `G`, `T`,
/// `P`, `E`, `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`, or an exponent `e`/`E`
/// with an integer). The value in thousandths of the unit, saturating.
pub fn quantity(field: &str, text: &str) -> Result<u128, WireError> {
    let fail = || {
        Err(bad(format!(
            "{field} {text:?} is not a Kubernetes quantity (a number and a suffix: 250m, 1.5, 512Mi, 2G)"
        )))
    };
    if text.is_empty() || text.len() > QUANTITY_BYTES_MAX {
        return fail();
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty())
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return fail();
    }
    // (multiplier, power of ten) of the suffix, in thousandths.
    let (binary, decimal_exp): (u128, i32) = match suffix {
        "" => (1, 0),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = exp[1..].strip_prefix(['+', '-']).unwrap_or(&exp[1..]);
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return fail();
            }
            match exp[1..].parse::<i32>() {
                Ok(e) => (1, e),
                Err(_) => return fail(),
            }
        }
        _ => return fail(),
    };
    // value * 1000 = (whole.fraction) * binary * 10^(decimal_exp + 3)
    let mut digits: u128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        digits = digits
            .saturating_mul(10)
            .saturating_add(u128::from(b - b'0'));
    }
    let fraction_len = i32::try_from(fraction.len()).unwrap_or(i32::MAX);
    let exp = decimal_exp.saturating_add(3).saturating_sub(fraction_len);
    let mut value = digits.saturating_mul(binary);
    if exp >= 0 {
        for _ in 0..exp.min(40) {
            value = value.saturating_mul(10);
        }
    } else {
        for _ in 0..(-exp).min(40) {
            value /= 10;
        }
    }
    Ok(value)
}

/// The basic shape of a cilium policy document, as Cilium's CRD validation
/// checks it: a JSON object (the object's `spec`) with exactly one of
/// `endpointSelector` and `nodeSelector`, itself an object; or a list of
/// such objects (the object's `specs`, 1 to [`POLICY_SPECS_MAX`]).
pub fn cilium_policy(field: &str, document: &serde_json::Value) -> Result<(), WireError> {
    match document {
        serde_json::Value::Object(_) => cilium_rule(field, document),
        serde_json::Value::Array(rules) => {
            if rules.is_empty() || rules.len() > POLICY_SPECS_MAX {
                return Err(bad(format!(
                    "{field} as a list (specs) holds 1 to {POLICY_SPECS_MAX} rules, not {}",
                    rules.len()
                )));
            }
            for (i, rule) in rules.iter().enumerate() {
                cilium_rule(&format!("{field}[{i}]"), rule)?;
            }
            Ok(())
        }
        _ => Err(bad(format!(
            "{field} must be a JSON object (the policy's spec) or a list of them (specs)"
        ))),
    }
}

fn cilium_rule(field: &str, rule: &serde_json::Value) -> Result<(), WireError> {
    let Some(rule) = rule.as_object() else {
        return Err(bad(format!(
            "{field} must be a JSON object (a policy rule)"
        )));
    };
    let selectors: Vec<&str> = ["endpointSelector", "nodeSelector"]
        .into_iter()
        .filter(|s| rule.contains_key(*s))
        .collect();
    match selectors.as_slice() {
        [one] if rule.get(*one).is_some_and(serde_json::Value::is_object) => Ok(()),
        [one] => Err(bad(format!(
            "{field}.{one} must be a JSON object (a label selector)"
        ))),
        [] => Err(bad(format!(
            "{field} needs an endpointSelector or a nodeSelector (Cilium refuses a rule without one)"
        ))),
        _ => Err(bad(format!(
            "{field} has both endpointSelector and nodeSelector; a rule has exactly one"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(result: Result<impl std::fmt::Debug, WireError>) -> String {
        let error = result.expect_err("refused");
        assert_eq!(error.code, ErrorCode::BadRequest);
        error.message
    }

    #[test]
    fn env_var_names_are_c_identifiers_with_dash_and_dot() {
        for ok in ["PATH", "_x", "a.b-c_1", "-x", ".env"] {
            env_var_name("env_vars", ok).unwrap();
        }
        for bad in ["", "1X", "A B", "A=B", "é", "a/b"] {
            let text = message(env_var_name("env_vars", bad));
            assert!(
                text.starts_with(&format!(
                    "env_vars {bad:?} is not a valid environment variable name"
                )),
                "{text}"
            );
        }
    }

    #[test]
    fn image_references_follow_the_docker_grammar() {
        for ok in [
            "nginx",
            "nginx:1.25",
            "library/nginx:latest",
            "registry.local:5000/team/app:v1.2-rc_3",
            "localhost/app",
            "ghcr.io/org/a__b.c--d:tag",
            "app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "r.io/app:1@sha256:0123456789abcdef0123456789abcdef",
            "Registry.Local/app",
        ] {
            image_reference("image", ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "it is empty"),
            ("Nginx", "each path component"),
            ("app:", "a tag is"),
            ("app:.x", "a tag is"),
            ("app:a b", "a tag is"),
            ("app@sha256:abc", "at least 32 hex"),
            ("app@abc", "algorithm:hex"),
            ("team//app", "each path component"),
            ("team/app-", "each path component"),
            ("team/a...b", "each path component"),
            ("reg.io:port/app", "the registry"),
            ("-reg.io/app", "the registry"),
            (":tag", "it has no name"),
        ] {
            let text = message(image_reference("image", bad));
            assert!(
                text.starts_with(&format!("image {bad:?} is not an image reference")),
                "{text}"
            );
            assert!(text.contains(why), "{bad}: {text}");
        }
        let long = format!("a/{}", "b".repeat(IMAGE_NAME_BYTES_MAX));
        assert!(message(image_reference("image", &long)).contains("longer than 255"));
        let tag = format!("app:{}", "t".repeat(IMAGE_TAG_BYTES_MAX + 1));
        assert!(message(image_reference("image", &tag)).contains("a tag is"));
    }

    #[test]
    fn quantities_parse_as_kubernetes_does() {
        for (text, thousandths) in [
            ("250m", 250),
            ("1", 1_000),
            ("1.5", 1_500),
            ("+2", 2_000),
            ("512Mi", 512 * 1024 * 1024 * 1_000),
            ("2G", 2_000_000_000_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("0.5k", 500_000),
            (".5", 500),
        ] {
            assert_eq!(quantity("cpu", text).unwrap(), thousandths, "{text}");
        }
        for bad in [
            "", "m", "1.2.3", "-1", "1 Gi", "1gi", "1Qi", "1e", "1e1000", "abc",
        ] {
            let text = message(quantity("memory", bad));
            assert!(
                text.starts_with(&format!("memory {bad:?} is not a Kubernetes quantity")),
                "{text}"
            );
        }
    }

    #[test]
    fn cpu_and_memory_are_bounded() {
        cpu_millicores("cpu_millicores", 250).unwrap();
        memory_mib("memory_mib", MEMORY_MIB_MAX).unwrap();
        assert_eq!(
            message(cpu_millicores("cpu_millicores", 0)),
            format!(
                "cpu_millicores must be between 1 and {CPU_MILLICORES_MAX} (millicores), not 0"
            )
        );
        assert!(
            message(memory_mib("memory_mib", MEMORY_MIB_MAX + 1))
                .starts_with("memory_mib must be between 1")
        );
    }

    #[test]
    fn a_cilium_policy_has_one_selector() {
        let doc = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        cilium_policy("policy_json", &doc(r#"{"endpointSelector":{}}"#)).unwrap();
        cilium_policy(
            "policy_json",
            &doc(r#"{"nodeSelector":{"matchLabels":{"a":"b"}}}"#),
        )
        .unwrap();
        cilium_policy(
            "policy_json",
            &doc(r#"[{"endpointSelector":{}},{"nodeSelector":{}}]"#),
        )
        .unwrap();
        for (bad, text) in [
            (
                "{}",
                "policy_json needs an endpointSelector or a nodeSelector (Cilium refuses a rule without one)",
            ),
            (r#"{"ingress":[]}"#, "policy_json needs an endpointSelector"),
            (
                r#"{"endpointSelector":[]}"#,
                "policy_json.endpointSelector must be a JSON object (a label selector)",
            ),
            (
                r#"{"endpointSelector":{},"nodeSelector":{}}"#,
                "policy_json has both endpointSelector and nodeSelector",
            ),
            (
                "[]",
                "policy_json as a list (specs) holds 1 to 64 rules, not 0",
            ),
            (
                r#"[{"endpointSelector":{}},{}]"#,
                "policy_json[1] needs an endpointSelector",
            ),
            (
                "[1]",
                "policy_json[0] must be a JSON object (a policy rule)",
            ),
            (
                "3",
                "policy_json must be a JSON object (the policy's spec) or a list of them (specs)",
            ),
        ] {
            let message = message(cilium_policy("policy_json", &doc(bad)));
            assert!(message.starts_with(text), "{bad}: {message}");
        }
    }
}
