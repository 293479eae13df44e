//! An operator's name, as certificates carry it and revocations name it:
//! its bound and its one check (apart from `access`, so that
//! `revocation` can check it without depending on the roles).

/// Longest operator name, in bytes.
pub const OPERATOR_NAME_BYTES_MAX: usize = 63;

/// Checks an operator's name: 1..=[`OPERATOR_NAME_BYTES_MAX`] bytes of
/// lowercase letters, digits, `-`, `_` and `.`, starting with a letter or
/// digit.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= OPERATOR_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "operator name {name:?} must be 1 to {OPERATOR_NAME_BYTES_MAX} bytes of lowercase letters, digits, '-', '_' and '.', starting with a letter or digit"
        ))
    }
}
