//! Finds which field a toml deserialization error is about, from the byte
//! span the toml crate reports, so parse errors can name the field in the
//! same dotted form as validation errors (`raft.bogus`, `peers[1].addr`).

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The dotted path of the key at `span` in `text`, or `None` when the span
/// is not inside any key or value (or the text is not TOML).
///
/// For "missing field `x`" errors the span covers the table the field is
/// missing from; the result is that table's path plus `x`.
pub(crate) fn field_at(text: &str, span: Range<usize>, message: &str) -> Option<String> {
    let document = DeTable::parse(text).ok()?;
    let mut best: Option<Found> = None;
    if let Some(name) = missing_field(message) {
        if span == document.span() || span.is_empty() {
            return Some(name.to_string());
        }
        find_container(document.get_ref(), "", &span, &mut best);
        return best.map(|found| join(&found.path, name));
    }
    find_key(document.get_ref(), "", span.start, &mut best);
    best.map(|found| found.path)
}

/// A candidate match: a path and the length of the span that matched.
struct Found {
    path: String,
    span_len: usize,
}

/// Keeps `path` if its span is no longer than the best so far; later
/// (deeper) candidates win ties.
fn offer(best: &mut Option<Found>, path: String, span: &Range<usize>) {
    let span_len = span.end.saturating_sub(span.start);
    if best.as_ref().is_none_or(|found| span_len <= found.span_len) {
        *best = Some(Found { path, span_len });
    }
}

fn contains(span: &Range<usize>, offset: usize) -> bool {
    span.start <= offset && offset < span.end
}

/// Every key or value whose span contains `offset`, the narrowest kept.
fn find_key(table: &DeTable<'_>, prefix: &str, offset: usize, best: &mut Option<Found>) {
    for (key, value) in table.iter() {
        let path = join(prefix, key.get_ref());
        if contains(&key.span(), offset) {
            offer(best, path.clone(), &key.span());
        }
        find_in_value(value, path, offset, best);
    }
}

fn find_in_value(
    value: &Spanned<DeValue<'_>>,
    path: String,
    offset: usize,
    best: &mut Option<Found>,
) {
    if contains(&value.span(), offset) {
        offer(best, path.clone(), &value.span());
    }
    match value.get_ref() {
        DeValue::Table(table) => find_key(table, &path, offset, best),
        DeValue::Array(array) => {
            for (index, element) in array.iter().enumerate() {
                find_in_value(element, format!("{path}[{index}]"), offset, best);
            }
        }
        _ => {}
    }
}

/// The table or array element whose span is exactly `span`.
fn find_container(
    table: &DeTable<'_>,
    prefix: &str,
    span: &Range<usize>,
    best: &mut Option<Found>,
) {
    for (key, value) in table.iter() {
        find_container_value(value, join(prefix, key.get_ref()), span, best);
    }
}

fn find_container_value(
    value: &Spanned<DeValue<'_>>,
    path: String,
    span: &Range<usize>,
    best: &mut Option<Found>,
) {
    match value.get_ref() {
        DeValue::Table(table) => {
            if value.span() == *span {
                offer(best, path.clone(), span);
            }
            find_container(table, &path, span, best);
        }
        DeValue::Array(array) => {
            for (index, element) in array.iter().enumerate() {
                find_container_value(element, format!("{path}[{index}]"), span, best);
            }
        }
        _ => {}
    }
}

fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        a: u64,
        #[serde(default)]
        b: u64,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        x: u64,
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        list: Vec<Inner>,
        #[serde(default)]
        addrs: Vec<std::net::SocketAddr>,
    }

    fn field_of(text: &str) -> Option<String> {
        let error = toml::from_str::<Outer>(text).expect_err("must not parse");
        field_at(text, error.span().unwrap_or(0..0), error.message())
    }

    #[test]
    fn names_unknown_fields_in_tables() {
        assert_eq!(field_of("x = 1\nbogus = 2\n").as_deref(), Some("bogus"));
        assert_eq!(
            field_of("x = 1\n[inner]\na = 1\nzz = 2\n").as_deref(),
            Some("inner.zz")
        );
        assert_eq!(
            field_of("x = 1\ninner.a = 1\ninner.q = 3\n").as_deref(),
            Some("inner.q")
        );
        assert_eq!(
            field_of("x = 1\ninner = { a = 1, q = 2 }\n").as_deref(),
            Some("inner.q")
        );
    }

    #[test]
    fn names_wrong_types_and_array_elements() {
        assert_eq!(field_of("x = \"s\"\n").as_deref(), Some("x"));
        assert_eq!(field_of("x = -1\n").as_deref(), Some("x"));
        assert_eq!(
            field_of("x = 1\n[[list]]\na = 1\n[[list]]\na = \"s\"\n").as_deref(),
            Some("list[1].a")
        );
        assert_eq!(
            field_of("x = 1\naddrs = [\"1.2.3.4:5\", \"nope\"]\n").as_deref(),
            Some("addrs[1]")
        );
    }

    #[test]
    fn names_missing_fields_with_their_table() {
        assert_eq!(field_of("inner.a = 1\n").as_deref(), Some("x"));
        assert_eq!(
            field_of("x = 1\n[inner]\nb = 1\n").as_deref(),
            Some("inner.a")
        );
        assert_eq!(
            field_of("x = 1\n[[list]]\na = 1\n[[list]]\nb = 2\n").as_deref(),
            Some("list[1].a")
        );
        assert_eq!(
            field_of("x = 1\nlist = [{ a = 1 }, { b = 1 }]\n").as_deref(),
            Some("list[1].a")
        );
    }

    #[test]
    fn syntax_errors_and_garbage_give_none_without_panicking() {
        assert_eq!(field_at("x = = 1", 4..5, "extra `=`"), None);
        assert_eq!(field_at("", 10..20, "whatever"), None);
        assert_eq!(field_at("x = 1", 100..200, "missing field `y"), None);
    }
}
