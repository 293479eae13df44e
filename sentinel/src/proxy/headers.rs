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

/// The hop-by-hop headers, always connection-specific (names made once,
/// not parsed per request).
const HOP_BY_HOP: [HeaderName; 9] = [
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
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    if headers.contains_key(CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .collect();
        for name in named {
            if !(upgrade && name == UPGRADE) {
                headers.remove(name);
            }
        }
    }
    for name in &HOP_BY_HOP {
        if upgrade && (name == UPGRADE || name == CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
    if upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Sets `Host` from `authority` when the request has none (HTTP/2 carries
/// it as `:authority`).
pub(super) fn ensure_host(headers: &mut HeaderMap, authority: Option<&Authority>) {
    if headers.contains_key(HOST) {
        return;
    }
    if let Some(value) = authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
        headers.insert(HOST, value);
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
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
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
