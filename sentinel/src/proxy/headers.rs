//! The header rewriting of a forwarded request and its response: hop-by-hop
//! headers (RFC 9110 §7.6.1, and those a `Connection` header names) are
//! stripped, except `Connection`/`Upgrade` on an upgrade; the `Host` of an
//! HTTP/2 request is made from its authority; `x-forwarded-for` gets the
//! client's address appended and `x-forwarded-proto` is set when absent
//! (a front proxy terminating TLS sets it to `https`, and that is kept).

use std::net::IpAddr;

use hyper::HeaderMap;
use hyper::header::{
    CONNECTION, Entry, HOST, HeaderName, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use hyper::http::uri::Authority;

/// `x-forwarded-for`.
pub(super) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `x-forwarded-proto`.
pub(super) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The hop-by-hop headers, always connection-specific, by their bit in
/// the set [`strip_hop_by_hop`] collects (a `static`: a `const` array
/// would be built and dropped at every use).
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
];
/// The bit of `Connection` in that set.
const CONNECTION_BIT: u16 = 1 << 0;
/// The bit of `Upgrade` in that set.
const UPGRADE_BIT: u16 = 1 << 8;
/// A bit past them: a header named `close` (which `Connection: close`
/// names, and hardly any message has).
const CLOSE_BIT: u16 = 1 << 9;

/// The bit of the header name `name` (lowercase, as a `HeaderName` is)
/// in the set of [`HOP_BY_HOP`] and [`CLOSE_BIT`], 0 when it is none of
/// them: a comparison of lengths and bytes, no hashing.
fn hop_by_hop_bit(name: &str) -> u16 {
    match name {
        "connection" => CONNECTION_BIT,
        "keep-alive" => 1 << 1,
        "proxy-connection" => 1 << 2,
        "proxy-authenticate" => 1 << 3,
        "proxy-authorization" => 1 << 4,
        "te" => 1 << 5,
        "trailer" => 1 << 6,
        "transfer-encoding" => 1 << 7,
        "upgrade" => UPGRADE_BIT,
        "close" => CLOSE_BIT,
        _ => 0,
    }
}

/// The tokens of a `Connection` value (none when it is not text).
fn tokens(value: &HeaderValue) -> impl Iterator<Item = &str> {
    value
        .to_str()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|token| !token.is_empty())
}

/// The bit of a `Connection` token (any case), as [`hop_by_hop_bit`].
fn token_bit(token: &str) -> u16 {
    let mut lower = [0_u8; 19];
    match lower.get_mut(..token.len()) {
        Some(lower) => {
            lower.copy_from_slice(token.as_bytes());
            lower.make_ascii_lowercase();
            std::str::from_utf8(lower).map_or(0, hop_by_hop_bit)
        }
        // Longer than every name of the set.
        None => 0,
    }
}

/// Whether `headers` ask for a protocol upgrade (`Connection: upgrade`
/// and an `Upgrade` header).
pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes the hop-by-hop headers; with `upgrade`, keeps `Upgrade` and
/// sets `Connection: upgrade`.
///
/// One pass over the names finds which of them are present (most
/// messages have none but `Connection`); only those are removed, and of
/// the names `Connection` lists only those not in the set (`keep-alive`,
/// `close` and the like are known: no lookup, no copy). Answers whether
/// a header outside the set was removed (as `Connection` asked).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) -> bool {
    let mut named_removed = false;
    let mut present = headers
        .keys()
        .fold(0, |set, name| set | hop_by_hop_bit(name.as_str()));
    if present & CONNECTION_BIT != 0 {
        let mut unknown = false;
        let mut close = false;
        for value in headers.get_all(CONNECTION) {
            // The usual values, known without splitting.
            if value.as_bytes().eq_ignore_ascii_case(b"keep-alive") {
                continue;
            }
            if value.as_bytes().eq_ignore_ascii_case(b"close") {
                close = true;
                continue;
            }
            for token in tokens(value) {
                match token_bit(token) {
                    0 => unknown = true,
                    CLOSE_BIT => close = true,
                    // In the set: removed below when present (`Upgrade`
                    // kept on an upgrade).
                    _ => {}
                }
            }
        }
        if close && present & CLOSE_BIT != 0 {
            headers.remove("close");
            named_removed = true;
        }
        if unknown {
            // Rare: the values copied out (a reference count each)
            // before the headers they name are removed.
            let values: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
            for token in values.iter().flat_map(tokens) {
                // By `&str`: looked up without making a name.
                if token_bit(token) == 0 && headers.remove(token).is_some() {
                    named_removed = true;
                }
            }
        }
    }
    if upgrade {
        // `Connection` is set below; `Upgrade` is kept.
        present &= !(CONNECTION_BIT | UPGRADE_BIT);
    }
    for (bit, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << bit) != 0 {
            headers.remove(name);
        }
    }
    if upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    named_removed
}

/// Sets `Host` from `authority` when the request has none (HTTP/2 carries
/// it as `:authority`).
/// Whether the request has a `Host` now.
pub(super) fn ensure_host(headers: &mut HeaderMap, authority: Option<&Authority>) -> bool {
    match headers.entry(HOST) {
        Entry::Occupied(_) => true,
        Entry::Vacant(entry) => {
            match authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
                Some(value) => {
                    entry.insert(value);
                    true
                }
                None => false,
            }
        }
    }
}

/// The client's address as an `x-forwarded-for` entry: made once per
/// client connection, for [`add_forwarded`].
pub(super) fn forwarded_for(client: IpAddr) -> HeaderValue {
    let text = client.to_string();
    // An IP address is always a valid header value.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Appends `client` (made by [`forwarded_for`]) to `x-forwarded-for` and
/// sets `x-forwarded-proto` when absent.
pub(super) fn add_forwarded(headers: &mut HeaderMap, client: &HeaderValue) {
    match headers.entry(X_FORWARDED_FOR) {
        Entry::Vacant(entry) => {
            entry.insert(client.clone());
        }
        Entry::Occupied(mut entry) => {
            // The values that are text, then the client, `, `-separated.
            let mut chain = String::new();
            for value in entry.iter().filter_map(|v| v.to_str().ok()) {
                chain.push_str(value);
                chain.push_str(", ");
            }
            if chain.is_empty() {
                entry.insert(client.clone());
            } else {
                chain.push_str(client.to_str().unwrap_or_default());
                if let Ok(value) = HeaderValue::from_str(&chain) {
                    entry.insert(value);
                }
            }
        }
    }
    if let Entry::Vacant(entry) = headers.entry(X_FORWARDED_PROTO) {
        entry.insert(HeaderValue::from_static("http"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_stripped() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("host", "example.com"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["accept", "host"]);
    }

    #[test]
    fn connection_names_in_any_case_are_stripped_and_close_only_when_named() {
        let mut h = headers(&[
            ("connection", "Keep-Alive, X-Secret"),
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("close", "named"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["accept"]);
        let mut h = headers(&[("connection", "keep-alive"), ("close", "kept")]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["close"]);
    }

    #[test]
    fn an_upgrade_keeps_its_upgrade_headers() {
        let mut h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("keep-alive", "timeout=5"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert!(!h.contains_key("keep-alive"));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
    }

    #[test]
    fn forwarded_headers_append_the_client_and_keep_a_proto() {
        let mut h = headers(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarded(&mut h, &forwarded_for("192.0.2.7".parse().unwrap()));
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.1, 192.0.2.7");
        assert_eq!(h[X_FORWARDED_PROTO], "https");
        let mut h = headers(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        add_forwarded(&mut h, &forwarded_for("192.0.2.7".parse().unwrap()));
        assert_eq!(
            h.get_all(X_FORWARDED_FOR).iter().collect::<Vec<_>>(),
            ["10.0.0.1, 10.0.0.2, 192.0.2.7"]
        );
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, &forwarded_for("::1".parse().unwrap()));
        assert_eq!(h[X_FORWARDED_FOR], "::1");
        assert_eq!(h[X_FORWARDED_PROTO], "http");
    }

    #[test]
    fn a_missing_host_is_made_from_the_authority() {
        let mut h = HeaderMap::new();
        let authority: Authority = "app.example:8040".parse().unwrap();
        ensure_host(&mut h, Some(&authority));
        assert_eq!(h[HOST], "app.example:8040");
        let mut h = headers(&[("host", "kept")]);
        ensure_host(&mut h, Some(&authority));
        assert_eq!(h[HOST], "kept");
    }
}
