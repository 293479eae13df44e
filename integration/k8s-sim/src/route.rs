//! Request paths and query strings: `/api/v1/namespaces/NS/pods/NAME/status`
//! and friends, parsed into a [`Route`].

use std::collections::BTreeMap;

use super::resources::{self, ResourceDef};

/// Longest path (or query string) accepted, in bytes.
pub const URI_BYTES_MAX: usize = 8192;

/// A subresource the simulator serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// `/status`: the object's `status` alone.
    Status,
    /// `/scale`: the object's replica count as a `Scale`.
    Scale,
    /// `pods/NAME/log`: a fixed line (simulated containers write nothing).
    Log,
}

/// A request for objects: one collection, maybe one object, maybe a
/// subresource of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectPath {
    /// The collection.
    pub res: &'static ResourceDef,
    /// `None`: cluster-scoped, or a namespaced collection across all
    /// namespaces.
    pub namespace: Option<String>,
    /// `None`: the whole collection.
    pub name: Option<String>,
    /// The subresource, if any.
    pub sub: Option<Sub>,
    /// Reached through the legacy `/watch/` path prefix.
    pub watch_prefix: bool,
}

/// Every path the simulator answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/version`.
    Version,
    /// `/api`: the core group's versions.
    CoreVersions,
    /// `/apis`: the named groups.
    Groups,
    /// `/apis/GROUP`.
    Group(String),
    /// `/api/v1` or `/apis/GROUP/VERSION`: the resource list.
    Resources {
        /// The API group, `""` for the core group.
        group: String,
        /// The group's version.
        version: String,
    },
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// `/openapi/v3`.
    OpenApiRoot,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION`: the rest
    /// of the path.
    OpenApiDocument(String),
    /// A collection, an object or a subresource.
    Objects(ObjectPath),
}

/// Why a path is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// Unknown path (404).
    NotFound,
    /// A known collection with an unknown subresource (404).
    UnknownSubresource(String),
}

/// Parses a request path (without the query string).
pub fn parse(path: &str) -> Result<Route, RouteError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Ok(Route::Version),
        ["healthz" | "livez" | "readyz", ..] => Ok(Route::Health),
        ["api"] => Ok(Route::CoreVersions),
        ["openapi", "v3"] => Ok(Route::OpenApiRoot),
        ["openapi", "v3", rest @ ..] => Ok(Route::OpenApiDocument(rest.join("/"))),
        ["apis"] => Ok(Route::Groups),
        ["apis", group] => {
            if resources::named_group_versions()
                .iter()
                .any(|(g, _)| g == group)
            {
                Ok(Route::Group(group.to_string()))
            } else {
                Err(RouteError::NotFound)
            }
        }
        ["api", version, rest @ ..] => resource_path("", version, rest),
        ["apis", group, version, rest @ ..] => resource_path(group, version, rest),
        _ => Err(RouteError::NotFound),
    }
}

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Result<Route, RouteError> {
    if resources::in_group_version(group, version).next().is_none() {
        return Err(RouteError::NotFound);
    }
    let (watch_prefix, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    if rest.is_empty() {
        return if watch_prefix {
            Err(RouteError::NotFound)
        } else {
            Ok(Route::Resources {
                group: group.to_string(),
                version: version.to_string(),
            })
        };
    }
    let find = |plural: &str| resources::find(group, version, plural).ok_or(RouteError::NotFound);
    // `namespaces/NS/PLURAL/...` is namespaced; `namespaces`, `namespaces/NS`
    // and `namespaces/NS/status` address Namespace objects.
    let (res, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if group.is_empty() && *plural != "status" && *plural != "finalize" =>
        {
            let res = find(plural)?;
            if !res.namespaced {
                return Err(RouteError::NotFound);
            }
            (res, Some(ns.to_string()), tail)
        }
        ["namespaces", ns, plural, tail @ ..] if !group.is_empty() => {
            let res = find(plural)?;
            if !res.namespaced {
                return Err(RouteError::NotFound);
            }
            (res, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => (find(plural)?, None, tail),
        [] => return Err(RouteError::NotFound),
    };
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, "status"] if res.has_status => (Some(name.to_string()), Some(Sub::Status)),
        [name, "scale"] if res.has_scale => (Some(name.to_string()), Some(Sub::Scale)),
        [name, "log"] if res.kind == "Pod" => (Some(name.to_string()), Some(Sub::Log)),
        [_, other] => return Err(RouteError::UnknownSubresource(other.to_string())),
        _ => return Err(RouteError::NotFound),
    };
    if watch_prefix && sub.is_some() {
        return Err(RouteError::NotFound);
    }
    Ok(Route::Objects(ObjectPath {
        res,
        namespace,
        name,
        sub,
        watch_prefix,
    }))
}

/// Decoded query parameters (the last of repeated keys wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query(pub BTreeMap<String, String>);

impl Query {
    /// Parses `a=b&c=d`, percent-decoding keys and values (`+` is a space).
    pub fn parse(query: &str) -> Query {
        let mut map = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.insert(percent_decode(k), percent_decode(v));
        }
        Query(map)
    }

    /// The value of query parameter `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `true`, `1` (and any case of `true`) are true.
    pub fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NAMESPACES, PODS, STATEFUL_SETS};

    fn objects(path: &str) -> ObjectPath {
        match parse(path) {
            Ok(Route::Objects(o)) => o,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn parses_object_paths() {
        let o = objects("/apis/apps/v1/namespaces/default/statefulsets/web/scale");
        assert_eq!(o.res, &STATEFUL_SETS);
        assert_eq!(o.namespace.as_deref(), Some("default"));
        assert_eq!(o.name.as_deref(), Some("web"));
        assert_eq!(o.sub, Some(Sub::Scale));
        let o = objects("/api/v1/pods");
        assert_eq!((o.res, o.namespace, o.name), (&PODS, None, None));
        let o = objects("/api/v1/namespaces/kube-system");
        assert_eq!(
            (o.res, o.name.as_deref()),
            (&NAMESPACES, Some("kube-system"))
        );
        let o = objects("/api/v1/namespaces/x/status");
        assert_eq!((o.res, o.sub), (&NAMESPACES, Some(Sub::Status)));
        let o = objects("/api/v1/watch/namespaces/x/pods");
        assert!(o.watch_prefix);
        assert_eq!(o.res, &PODS);
        assert_eq!(
            parse("/apis/apps/v1"),
            Ok(Route::Resources {
                group: "apps".into(),
                version: "v1".into()
            })
        );
        assert_eq!(parse("/apis/nope/v1/things"), Err(RouteError::NotFound));
        assert_eq!(
            parse("/api/v1/namespaces/x/pods/p/exec"),
            Err(RouteError::UnknownSubresource("exec".into()))
        );
        assert_eq!(
            parse("/api/v1/namespaces/x/namespaces"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn decodes_queries() {
        let q = Query::parse("labelSelector=app%3Dx%2Cenv%21%3Dprod&watch=1&bad=%zz&x");
        assert_eq!(q.get("labelSelector"), Some("app=x,env!=prod"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("bad"), Some("%zz"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(Query::parse("a=%e2%82%ac+b").get("a"), Some("€ b"));
        assert_eq!(Query::parse("a=%4").get("a"), Some("%4"));
    }
}
