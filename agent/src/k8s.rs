//! The Kubernetes side shared by krane's controllers: the client, the
//! field manager and labels, and the two guarded operations every
//! controller uses — server-side apply and delete — which never touch an
//! object that lacks krane's managed-by label.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

/// The server-side apply field manager of every object krane writes.
pub const FIELD_MANAGER: &str = "krane";
pub use wire::k8s_name::{
    APP_ID_LABEL, COMPONENT_LABEL, DEPLOYMENT_ID_LABEL, ENVIRONMENT_ID_LABEL,
    LABEL_VALUE_BYTES_MAX, MANAGED_BY_LABEL, MANAGED_BY_SELECTOR, MANAGED_BY_VALUE,
    POLICY_ID_LABEL, PROJECT_ID_LABEL, SENTINEL_ID_LABEL, WORKSPACE_ID_LABEL, label_value,
};
/// Annotation of a sentinel's Deployment: the sentinel version (ctrl's
/// change pk) whose spec it carries, so krane can tell which version a
/// generation Kubernetes observed belongs to.
pub const SENTINEL_VERSION_ANNOTATION: &str = "unkey.com/sentinel.version";
/// Most namespaces krane remembers having checked or created.
pub const KNOWN_NAMESPACES_MAX: usize = 1_024;

/// A Kubernetes operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum K8sError {
    /// The kubeconfig file could not be read or used.
    #[error("cannot read kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// kube's error.
        source: Box<kube::config::KubeconfigError>,
    },
    /// The in-cluster service account config is missing or invalid.
    #[error("in-cluster Kubernetes config: {0}")]
    InCluster(Box<kube::config::InClusterError>),
    /// An API call on one object failed.
    #[error("{kind} {namespace}/{name}: {source}")]
    Api {
        /// The object's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// kube's error.
        source: Box<kube::Error>,
    },
    /// The Kubernetes client could not be built, or a list call failed.
    #[error("Kubernetes client: {0}")]
    Client(Box<kube::Error>),
    /// An object krane built or read is invalid; says why.
    #[error("{0}")]
    Invalid(String),
    /// An object of the name krane would apply exists and is not krane's
    /// (no managed-by label): krane leaves it alone, and the version is
    /// refused for good (a 409 rejection naming the object).
    #[error(
        "{kind} {namespace}/{name} exists and krane does not manage it (no \
         {MANAGED_BY_LABEL}={MANAGED_BY_VALUE} label); krane leaves it alone: delete or \
         rename it"
    )]
    Foreign {
        /// The object's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// What was applied could not be recorded in the local state (the
    /// apply is retried).
    #[error("cannot record the apply in the local state: {0}")]
    LocalState(Box<crate::state::StateError>),
}

impl From<kube::Error> for K8sError {
    fn from(e: kube::Error) -> Self {
        K8sError::Client(Box::new(e))
    }
}

/// Kubernetes' refusal of an object for good: what krane records against
/// the resource's version and reports to ctrl instead of retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The API server's message (or krane's, for an object it would not
    /// send), at most [`wire::model::FAILED_APPLY_ERROR_BYTES_MAX`] bytes.
    pub reason: String,
    /// The HTTP status; 0 when krane refused the object it built.
    pub code: u16,
    /// The first field the API server named, if any.
    pub field: Option<String>,
}

impl K8sError {
    /// The refusal, if this error is permanent for the object as it is:
    /// 400 Bad Request, 422 Invalid, 413 too large, 403 from an admission
    /// webhook, or an object krane itself found invalid. Conflicts (409),
    /// throttling (429), other 4xx (401, 403 by RBAC, 404, 408, 410), 5xx,
    /// timeouts and connection errors are transient: `None`, retried with
    /// backoff.
    pub fn rejection(&self) -> Option<Rejection> {
        let status = match self {
            K8sError::Invalid(message) => {
                return Some(Rejection {
                    reason: cut(message),
                    code: 0,
                    field: None,
                });
            }
            K8sError::Foreign { .. } => {
                return Some(Rejection {
                    reason: cut(&self.to_string()),
                    code: FOREIGN_CODE,
                    field: None,
                });
            }
            K8sError::Api { source, .. } | K8sError::Client(source) => match source.as_ref() {
                kube::Error::Api(status) => status,
                _ => return None,
            },
            _ => return None,
        };
        let admission = status.code == 403
            && (status.message.contains("admission webhook")
                || status.message.contains("denied the request"));
        let permanent = matches!(status.code, 400 | 413 | 422) || admission;
        if !permanent {
            return None;
        }
        let field = status
            .details
            .as_ref()
            .and_then(|d| d.causes.iter().find(|c| !c.field.is_empty()))
            .map(|c| cut(&c.field));
        Some(Rejection {
            reason: cut(&status.message),
            code: status.code,
            field,
        })
    }

    /// Whether the API server answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        match self {
            K8sError::Api { source, .. } => {
                matches!(source.as_ref(), kube::Error::Api(status) if status.is_not_found())
            }
            K8sError::Client(source) => {
                matches!(source.as_ref(), kube::Error::Api(status) if status.is_not_found())
            }
            _ => false,
        }
    }
}

/// The client for `kubeconfig`, or the in-cluster config when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, K8sError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                K8sError::Kubeconfig {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                }
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| K8sError::Kubeconfig {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                })?
        }
        None => kube::Config::incluster().map_err(|e| K8sError::InCluster(Box::new(e)))?,
    };
    Ok(Client::try_from(config)?)
}

/// `text` cut to [`wire::model::FAILED_APPLY_ERROR_BYTES_MAX`] bytes at a
/// character boundary.
fn cut(text: &str) -> String {
    let mut end = text.len().min(wire::model::FAILED_APPLY_ERROR_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Whether an object carries krane's managed-by label.
pub fn is_managed(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL))
        .is_some_and(|value| value == MANAGED_BY_VALUE)
}

/// The status code of the rejection of a version whose object's name is
/// held by an object krane does not manage (409 Conflict).
pub const FOREIGN_CODE: u16 = 409;

/// What a guarded operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied, deleted, or already absent.
    Done,
    /// An object of that name exists without krane's label; left alone.
    Foreign,
}

/// Applies `object` with server-side apply under [`FIELD_MANAGER`],
/// forcing ownership of the fields it sets; an object of that name
/// without krane's label is left alone and the apply fails with
/// [`K8sError::Foreign`] (a rejection: the version is reported refused).
pub async fn apply<K>(client: &Client, namespace: &str, object: &K) -> Result<Outcome, K8sError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    guarded_apply(&api, K::KIND, namespace, object).await
}

/// Deletes `name` if it exists and carries krane's label; the delete is
/// conditional on the uid that was checked. Absent is success.
pub async fn delete<K>(client: &Client, namespace: &str, name: &str) -> Result<Outcome, K8sError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    guarded_delete(&api, K::KIND, namespace, name).await
}

/// [`apply`] for a custom object without a typed binding (a
/// `DynamicObject` of the kind `resource` describes).
pub async fn apply_dynamic(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    object: &DynamicObject,
) -> Result<Outcome, K8sError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    guarded_apply(&api, dynamic_kind(resource), namespace, object).await
}

/// [`delete`] for a custom object of the kind `resource` describes.
pub async fn delete_dynamic(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> Result<Outcome, K8sError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    guarded_delete(&api, dynamic_kind(resource), namespace, name).await
}

/// The managed-by guard, then server-side apply: shared by the typed and
/// the dynamic kinds.
async fn guarded_apply<K>(
    api: &Api<K>,
    kind: &'static str,
    namespace: &str,
    object: &K,
) -> Result<Outcome, K8sError>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = object.name_any();
    let error = |source| api_error(kind, namespace, &name, source);
    if let Some(existing) = api.get_metadata_opt(&name).await.map_err(error)?
        && !is_managed(&existing.metadata)
    {
        warn!(
            kind,
            namespace, name, "exists without the managed-by label; left alone"
        );
        return Err(K8sError::Foreign {
            kind,
            namespace: namespace.to_string(),
            name,
        });
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(error)?;
    debug!(kind, namespace, name, "applied");
    Ok(Outcome::Done)
}

/// The managed-by guard, then a delete conditional on the checked uid:
/// shared by the typed and the dynamic kinds.
async fn guarded_delete<K>(
    api: &Api<K>,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> Result<Outcome, K8sError>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let error = |source| api_error(kind, namespace, name, source);
    let Some(existing) = api.get_metadata_opt(name).await.map_err(error)? else {
        return Ok(Outcome::Done);
    };
    if !is_managed(&existing.metadata) {
        warn!(
            kind,
            namespace, name, "exists without the managed-by label; not deleted"
        );
        return Ok(Outcome::Foreign);
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            debug!(kind, namespace, name, "deleted");
            Ok(Outcome::Done)
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Outcome::Done),
        Err(e) => Err(error(e)),
    }
}

fn api_error(kind: &'static str, namespace: &str, name: &str, source: kube::Error) -> K8sError {
    K8sError::Api {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        source: Box::new(source),
    }
}

/// Refuses an object krane could not find again or Kubernetes would
/// refuse: `id` must be a label value as it is, and no named field empty.
pub fn check_names(what: &str, id: &str, fields: &[(&str, &str)]) -> Result<(), K8sError> {
    if label_value(id) != id {
        return Err(K8sError::Invalid(format!(
            "{what} id {id:?} is not a valid label value"
        )));
    }
    match fields.iter().find(|(_, value)| value.is_empty()) {
        Some((field, _)) => Err(K8sError::Invalid(format!("{what} {id}: {field} is empty"))),
        None => Ok(()),
    }
}

/// The kinds krane writes dynamically have static names; errors carry a
/// `&'static str`.
fn dynamic_kind(resource: &ApiResource) -> &'static str {
    match resource.kind.as_str() {
        "CiliumNetworkPolicy" => "CiliumNetworkPolicy",
        _ => "custom object",
    }
}

/// Makes sure namespaces exist before objects are applied in them: a
/// missing namespace is created with krane's label (an existing one is
/// never changed; one krane may not read is assumed to exist). Remembers
/// what it checked.
#[derive(Debug, Default)]
pub struct Namespaces {
    known: Mutex<BTreeSet<String>>,
}

impl Namespaces {
    /// Creates namespace `name` unless it exists or was seen already.
    pub async fn ensure(&self, client: &Client, name: &str) -> Result<(), K8sError> {
        if self.lock().contains(name) {
            return Ok(());
        }
        let api: Api<Namespace> = Api::all(client.clone());
        let error = |source| K8sError::Api {
            kind: "Namespace",
            namespace: String::new(),
            name: name.to_string(),
            source: Box::new(source),
        };
        let exists = match api.get_metadata_opt(name).await {
            Ok(found) => found.is_some(),
            // A namespace-scoped role may not read namespaces: assume the
            // operator created it; applying in it will say otherwise.
            Err(kube::Error::Api(status)) if status.is_forbidden() => true,
            Err(e) => return Err(error(e)),
        };
        if !exists {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(BTreeMap::from([(
                        MANAGED_BY_LABEL.to_string(),
                        MANAGED_BY_VALUE.to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match api.create(&PostParams::default(), &namespace).await {
                Ok(_) => debug!(namespace = name, "created namespace"),
                Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                Err(e) => return Err(error(e)),
            }
        }
        let mut known = self.lock();
        if known.len() < KNOWN_NAMESPACES_MAX {
            known.insert(name.to_string());
        }
        Ok(())
    }

    /// Forgets `name`, so that the next [`Namespaces::ensure`] checks it
    /// again (after a write there failed with 404: it was deleted).
    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // The set is only ever inserted into; a panic elsewhere cannot
        // leave it inconsistent.
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_made_valid() {
        assert_eq!(label_value("dep_20yysmkk16yj3"), "dep_20yysmkk16yj3");
        assert_eq!(label_value("my workspace/1"), "my-workspace-1");
        assert_eq!(label_value("-_x_-"), "x");
        assert_eq!(label_value("é"), "");
        assert_eq!(label_value(&"a".repeat(100)).len(), LABEL_VALUE_BYTES_MAX);
    }

    #[test]
    fn managed_needs_the_exact_label() {
        let mut meta = ObjectMeta::default();
        assert!(!is_managed(&meta));
        meta.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            "helm".to_string(),
        )]));
        assert!(!is_managed(&meta));
        meta.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )]));
        assert!(is_managed(&meta));
    }
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    fn api(code: u16, message: &str, field: Option<&str>) -> K8sError {
        let mut status = kube::core::Status::failure(message, "Invalid").with_code(code);
        if let Some(field) = field {
            status = status.with_details(kube::core::response::StatusDetails {
                causes: vec![kube::core::response::StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value".into(),
                    field: field.into(),
                }],
                name: "web".into(),
                group: "apps".into(),
                kind: "statefulsets".into(),
                uid: String::new(),
                retry_after_seconds: 0,
            });
        }
        K8sError::Api {
            kind: "StatefulSet",
            namespace: "apps".into(),
            name: "web".into(),
            source: Box::new(kube::Error::Api(status.boxed())),
        }
    }

    #[test]
    fn validation_errors_are_permanent_conflicts_and_throttling_are_not() {
        let invalid = api(422, "StatefulSet.apps \"web\" is invalid", Some("spec.x"));
        assert_eq!(
            invalid.rejection(),
            Some(Rejection {
                reason: "StatefulSet.apps \"web\" is invalid".into(),
                code: 422,
                field: Some("spec.x".into()),
            })
        );
        assert_eq!(api(400, "bad", None).rejection().map(|r| r.code), Some(400));
        assert_eq!(
            api(403, "admission webhook \"x\" denied the request: no", None)
                .rejection()
                .map(|r| r.code),
            Some(403)
        );
        for transient in [
            api(403, "User \"krane\" cannot patch", None),
            api(409, "conflict", None),
            api(429, "too many requests", None),
            api(404, "not found", None),
            api(500, "etcd timeout", None),
            api(503, "unavailable", None),
        ] {
            assert_eq!(transient.rejection(), None, "{transient}");
        }
        let built = K8sError::Invalid("x".repeat(5_000));
        let rejection = built.rejection().unwrap();
        assert_eq!(rejection.code, 0);
        assert_eq!(
            rejection.reason.len(),
            wire::model::FAILED_APPLY_ERROR_BYTES_MAX
        );
    }
}
