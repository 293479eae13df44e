//! Which API verbs clients used on which resources, named as Kubernetes
//! RBAC names them (`get`, `list`, `watch`, `create`, `update`, `patch`,
//! `delete`, `deletecollection`; resources as `plural` or
//! `plural/subresource`), so a test can check that a Role grants exactly
//! what a client needs. Only object paths count; discovery and health are
//! non-resource URLs.

use super::route::{self, Query, Route, Sub};

/// Most distinct accesses recorded (there are a few dozen in practice).
pub const ACCESSES_MAX: usize = 4_096;

/// One kind of access a client made.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    /// API group, `""` for the core group.
    pub group: String,
    /// `pods`, `pods/status`, `statefulsets/scale`…
    pub resource: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `patch`, ...).
    pub verb: &'static str,
}

/// The access a request makes, if it addresses objects.
pub fn access(method: &str, path: &str, query: &Query) -> Option<Access> {
    let Ok(Route::Objects(p)) = route::parse(path) else {
        return None;
    };
    let one = p.name.is_some();
    let verb = match method {
        "GET" if p.watch_prefix || query.flag("watch") => "watch",
        "GET" if one => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if one => "delete",
        "DELETE" => "deletecollection",
        _ => return None,
    };
    let resource = match p.sub {
        None => p.res.plural.to_string(),
        Some(Sub::Status) => format!("{}/status", p.res.plural),
        Some(Sub::Scale) => format!("{}/scale", p.res.plural),
        Some(Sub::Log) => format!("{}/log", p.res.plural),
    };
    Some(Access {
        group: p.res.group.to_string(),
        resource,
        verb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(method: &str, path: &str, query: &str) -> Option<(String, String, &'static str)> {
        access(method, path, &Query::parse(query)).map(|a| (a.group, a.resource, a.verb))
    }

    #[test]
    fn requests_map_to_rbac_verbs() {
        let sts = "/apis/apps/v1/namespaces/krane/statefulsets";
        assert_eq!(
            verb("GET", sts, ""),
            Some(("apps".into(), "statefulsets".into(), "list"))
        );
        assert_eq!(verb("GET", sts, "watch=true").unwrap().2, "watch");
        assert_eq!(verb("GET", &format!("{sts}/web"), "").unwrap().2, "get");
        assert_eq!(verb("PATCH", &format!("{sts}/web"), "").unwrap().2, "patch");
        assert_eq!(
            verb("DELETE", &format!("{sts}/web"), "").unwrap().2,
            "delete"
        );
        assert_eq!(verb("DELETE", sts, "").unwrap().2, "deletecollection");
        assert_eq!(
            verb("PUT", &format!("{sts}/web/scale"), ""),
            Some(("apps".into(), "statefulsets/scale".into(), "update"))
        );
        assert_eq!(
            verb("POST", "/api/v1/namespaces", ""),
            Some((String::new(), "namespaces".into(), "create"))
        );
        assert_eq!(verb("GET", "/api/v1", ""), None, "discovery");
        assert_eq!(verb("GET", "/healthz", ""), None);
    }
}
