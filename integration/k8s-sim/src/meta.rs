//! Small helpers on object metadata: timestamps, uids, name checks and
//! JSON path access.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// Longest object name accepted (a DNS subdomain).
pub const NAME_BYTES_MAX: usize = 253;

/// Formats a wall-clock time as RFC 3339 in UTC with second precision,
/// the form of `creationTimestamp`.
pub fn rfc3339(at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Parses what [`rfc3339`] writes (second precision, `Z`); `None` otherwise.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + std::time::Duration::from_secs(s))
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A 64-bit mixer (splitmix64) for uids, hashes and name suffixes.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A version-4-shaped uid from a seed and a counter (unique per simulator).
pub fn uid(seed: u64, counter: u64) -> String {
    let a = mix64(seed ^ counter);
    let b = mix64(a ^ counter.rotate_left(17));
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

/// The alphabet Kubernetes uses for generated names and template hashes.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `len` characters of the safe alphabet derived from `x`.
pub fn safe_string(mut x: u64, len: usize) -> String {
    let mut out = String::with_capacity(len);
    for _ in 0..len {
        if x < SAFE_ALPHABET.len() as u64 {
            x = mix64(x);
        }
        // The remainder is below the alphabet's length (27): it fits `usize`.
        #[allow(clippy::cast_possible_truncation)]
        let digit = (x % SAFE_ALPHABET.len() as u64) as usize;
        out.push(SAFE_ALPHABET[digit] as char);
        x /= SAFE_ALPHABET.len() as u64;
    }
    out
}

/// A stable hash of a JSON value (for template hashes).
pub fn hash_value(v: &Value) -> u64 {
    // FNV-1a over the canonical serialisation (map keys are sorted).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Whether `name` is a valid object name (DNS subdomain, lower case).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

/// `metadata` as a mutable map, created (or replaced, if not a map) on need.
pub fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = Value::Object(Map::new());
    }
    match object.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Invariant: set to an object just above.
        _ => unreachable!("metadata is an object"),
    }
}

/// A string field of `metadata`.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// `metadata.name`, or `""`.
pub fn name_of(object: &Value) -> &str {
    meta_str(object, "name").unwrap_or("")
}

/// The object's `metadata.resourceVersion` parsed, or 0.
pub fn resource_version_of(object: &Value) -> u64 {
    meta_str(object, "resourceVersion")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Whether `object` lists an owner reference with this uid.
pub fn owned_by(object: &Value, owner_uid: &str) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_and_parses_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_199); // 2024-02-29T23:59:59Z
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59Z");
        assert_eq!(parse_rfc3339("2024-02-29T23:59:59Z"), Some(t));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn uids_and_names() {
        let a = uid(7, 1);
        assert_eq!(a.len(), 36);
        assert_ne!(a, uid(7, 2));
        assert_eq!(safe_string(42, 5).len(), 5);
        assert!(valid_name("web-0"));
        assert!(valid_name("a.b"));
        assert!(!valid_name("Web"));
        assert!(!valid_name("-a"));
        assert!(!valid_name(""));
    }
}
