//! Environments as operators see them: the live deployment and, per
//! region, the route krane writes for the environment's sentinel and the
//! sentinel's Service — the environment's stable address there.

use storage::ReadView;
use wire::model::{Environment, ResourceKey, ResourceType};
use wire::operator::{EnvironmentView, LIST_PAGE_MAX, RouteView, SENTINEL_PORT};
use wire::{ErrorCode, WireError};

use super::{ReadState, internal};

/// The environment `id` with its routes.
pub fn describe(state: &impl ReadState, id: &str) -> Result<EnvironmentView, WireError> {
    let view = state.read().map_err(internal)?;
    let environment = view
        .environment(id)
        .map_err(internal)?
        .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no environment {id:?}")))?;
    environment_view(&view, environment)
}

/// A page of environments (by id, after `after`) with their routes, and
/// where the next page starts.
pub fn list(
    state: &impl ReadState,
    after: Option<String>,
    limit: u32,
) -> Result<(Vec<EnvironmentView>, Option<String>), WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.read().map_err(internal)?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let environments = view
        .list_environments(after.as_deref(), limit)
        .map_err(internal)?;
    let next_after = (environments.len() == limit)
        .then(|| environments.last().map(|e| e.id.clone()))
        .flatten();
    let items = environments
        .into_iter()
        .map(|e| environment_view(&view, e))
        .collect::<Result<_, _>>()?;
    Ok((items, next_after))
}

/// `environment` with its route in each region of the cluster that has
/// one (found by key: a route's id is derived from both).
fn environment_view(
    view: &ReadView,
    environment: Environment,
) -> Result<EnvironmentView, WireError> {
    let mut routes = Vec::new();
    for region in view.list_regions().map_err(internal)? {
        let Some(route) = view
            .environment_route(&environment.id, &region.name)
            .map_err(internal)?
        else {
            continue;
        };
        let key = ResourceKey {
            resource_type: ResourceType::Route,
            resource_id: route.id.clone(),
            region: route.region.clone(),
        };
        // A refusal of an older version is stale; a served report of any
        // version says what the region's sentinel serves.
        let report = view
            .apply_report(&key)
            .map_err(internal)?
            .filter(|r| r.outcome.is_applied() || r.version >= route.version);
        routes.push(RouteView {
            address: format!(
                "{}.{}.svc:{SENTINEL_PORT}",
                route.sentinel_k8s_name, route.k8s_namespace
            ),
            route,
            report,
        });
    }
    Ok(EnvironmentView {
        environment,
        routes,
    })
}
