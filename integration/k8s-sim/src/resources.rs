//! The resource kinds the simulator serves: one static table, from which
//! discovery documents, routing and the storage keys are all derived.
//!
//! Adding a kind is adding a row; every kind is stored generically as JSON.

/// One served resource (a REST collection), as discovery describes it.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group, `""` for the core (legacy) group.
    pub group: &'static str,
    /// API version (`v1`).
    pub version: &'static str,
    /// Lower-case plural, the path segment (`statefulsets`).
    pub plural: &'static str,
    /// Lower-case singular (`statefulset`).
    pub singular: &'static str,
    /// The kind (`StatefulSet`).
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names kubectl accepts (`sts`).
    pub short_names: &'static [&'static str],
    /// Has a `/status` subresource: the main resource ignores `.status`
    /// writes and `/status` writes only `.status`.
    pub has_status: bool,
    /// Has a `/scale` subresource (`autoscaling/v1` `Scale`).
    pub has_scale: bool,
}

impl ResourceDef {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `statefulsets.apps`, `pods`: the name used in error messages.
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The path prefix of the collection: `/api/v1` or `/apis/apps/v1`.
    pub fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The verbs every collection supports.
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The verbs of the `status` and `scale` subresources.
pub const SUBRESOURCE_VERBS: &[&str] = &["get", "patch", "update"];

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
) -> ResourceDef {
    ResourceDef {
        group: "",
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        has_status,
        has_scale: false,
    }
}

/// `v1` namespaces.
pub static NAMESPACES: ResourceDef =
    core("namespaces", "namespace", "Namespace", false, &["ns"], true);
/// `v1` pods.
pub static PODS: ResourceDef = core("pods", "pod", "Pod", true, &["po"], true);
/// `v1` services.
pub static SERVICES: ResourceDef = core("services", "service", "Service", true, &["svc"], true);
/// `v1` configmaps.
pub static CONFIG_MAPS: ResourceDef =
    core("configmaps", "configmap", "ConfigMap", true, &["cm"], false);
/// `v1` secrets.
pub static SECRETS: ResourceDef = core("secrets", "secret", "Secret", true, &[], false);
/// `v1` events.
pub static EVENTS: ResourceDef = core("events", "event", "Event", true, &["ev"], false);
/// `v1` serviceaccounts (stored only: no token is minted).
pub static SERVICE_ACCOUNTS: ResourceDef = core(
    "serviceaccounts",
    "serviceaccount",
    "ServiceAccount",
    true,
    &["sa"],
    false,
);

/// `apps/v1` statefulsets.
pub static STATEFUL_SETS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    plural: "statefulsets",
    singular: "statefulset",
    kind: "StatefulSet",
    namespaced: true,
    short_names: &["sts"],
    has_status: true,
    has_scale: true,
};

/// `apps/v1` deployments.
pub static DEPLOYMENTS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    plural: "deployments",
    singular: "deployment",
    kind: "Deployment",
    namespaced: true,
    short_names: &["deploy"],
    has_status: true,
    has_scale: true,
};

/// Stored only (no controller): served so `kubectl describe deployment`
/// finds an (empty) collection.
pub static REPLICA_SETS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    plural: "replicasets",
    singular: "replicaset",
    kind: "ReplicaSet",
    namespaced: true,
    short_names: &["rs"],
    has_status: true,
    has_scale: true,
};

/// `policy/v1` poddisruptionbudgets.
pub static POD_DISRUPTION_BUDGETS: ResourceDef = ResourceDef {
    group: "policy",
    version: "v1",
    plural: "poddisruptionbudgets",
    singular: "poddisruptionbudget",
    kind: "PodDisruptionBudget",
    namespaced: true,
    short_names: &["pdb"],
    has_status: true,
    has_scale: false,
};

const fn rbac(plural: &'static str, singular: &'static str, kind: &'static str) -> ResourceDef {
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural,
        singular,
        kind,
        namespaced: true,
        short_names: &[],
        has_status: false,
        has_scale: false,
    }
}

/// `rbac.authorization.k8s.io/v1` roles (stored only: the simulator
/// authorizes nothing).
pub static ROLES: ResourceDef = rbac("roles", "role", "Role");
/// `rbac.authorization.k8s.io/v1` rolebindings (stored only).
pub static ROLE_BINDINGS: ResourceDef = rbac("rolebindings", "rolebinding", "RoleBinding");

/// `cilium.io/v2` ciliumnetworkpolicies.
pub static CILIUM_NETWORK_POLICIES: ResourceDef = ResourceDef {
    group: "cilium.io",
    version: "v2",
    plural: "ciliumnetworkpolicies",
    singular: "ciliumnetworkpolicy",
    kind: "CiliumNetworkPolicy",
    namespaced: true,
    short_names: &["cnp", "ciliumnp"],
    has_status: true,
    has_scale: false,
};

/// Every served resource, grouped by group/version in discovery order.
pub static RESOURCES: &[&ResourceDef] = &[
    &NAMESPACES,
    &PODS,
    &SERVICES,
    &CONFIG_MAPS,
    &SECRETS,
    &EVENTS,
    &SERVICE_ACCOUNTS,
    &STATEFUL_SETS,
    &DEPLOYMENTS,
    &REPLICA_SETS,
    &POD_DISRUPTION_BUDGETS,
    &ROLES,
    &ROLE_BINDINGS,
    &CILIUM_NETWORK_POLICIES,
];

/// The (group, version) pairs of the named groups, in discovery order.
pub fn named_group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The resources of one group/version.
pub fn in_group_version(group: &str, version: &str) -> impl Iterator<Item = &'static ResourceDef> {
    RESOURCES
        .iter()
        .copied()
        .filter(move |r| r.group == group && r.version == version)
}

/// Looks a collection up by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    in_group_version(group, version).find(|r| r.plural == plural)
}
