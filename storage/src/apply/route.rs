//! Routes: which deployment takes an environment's traffic in each region
//! (what the region's sentinel serves). Written in the same apply as the
//! transition that changes the environment's live deployment — finalize,
//! a rollback within the grace period, a forced stop of the live one — as
//! a new version with a change row of the region, so krane gets it like
//! any other change.
//!
//! A route never points at a deployment with no running instance in its
//! region: the route keeps its backends and names the wanted deployment
//! `pending` until the apply of an instance report shows it running there
//! ([`Applier::route_instances_reported`]). A deployment that declares no
//! port cannot be routed: the route stays on what it had.
//!
//! An environment's first deploy is routed when it reaches the `network`
//! step (its instances run; nothing live is there to protect): the
//! sentinel then holds a route to serve, becomes ready, and the deploy
//! goes on to be live.

use std::collections::BTreeSet;

use wire::k8s_name::{SENTINEL_NAMESPACE, sentinel as sentinel_k8s_name, sentinel_routes};
use wire::model::{Deployment, ROUTE_WEIGHT_ALL, ResourceType, Route, RouteWeight};
use wire::rules::deploy::{route_id, sentinel_id};

use super::{Applier, OP};
use crate::error::{RedbContext, Result};
use crate::read::find_environment_sentinel;
use crate::tables::{encode, load, name};

/// What a region's route should say.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    /// Route to this deployment (it runs in the region, with a port).
    To(RouteWeight),
    /// This deployment should take the traffic but runs nowhere here yet.
    Pending(String),
    /// Keep what the route has (the wanted deployment cannot be routed).
    Keep,
    /// Nothing takes the environment's traffic here.
    Nothing,
}

impl Applier<'_> {
    fn route_row(&self, environment_id: &str, region: &str) -> Result<Option<Route>> {
        load(
            &self.t.routes,
            name::ROUTES,
            (region, route_id(environment_id, region).as_str()),
        )
    }

    /// Brings the routes of `environment_id` in line with `target` (its
    /// live deployment, or `None`) in `target`'s regions and in `also`'s
    /// (the deployment that had the traffic before).
    pub(super) fn sync_routes(
        &mut self,
        environment_id: &str,
        target: Option<&Deployment>,
        also: Option<&Deployment>,
    ) -> Result<()> {
        let regions: BTreeSet<&str> = target
            .iter()
            .chain(also.iter())
            .flat_map(|d| d.regions.iter().map(String::as_str))
            .collect();
        for region in regions {
            let wanted = match target {
                Some(d) if d.regions.iter().any(|r| r == region) => self.wanted(d, region)?,
                _ => Wanted::Nothing,
            };
            let owner = target.or(also);
            if let Some(owner) = owner {
                self.write_route(owner, environment_id, region, wanted)?;
            }
        }
        Ok(())
    }

    /// What routing to `deployment` in `region` means now.
    fn wanted(&self, deployment: &Deployment, region: &str) -> Result<Wanted> {
        let Some(port) = deployment.spec.port else {
            return Ok(Wanted::Keep);
        };
        if !deployment.desired_state.runs() {
            return Ok(Wanted::Nothing);
        }
        let (_, running) = self.instances_of(&deployment.id, region)?;
        Ok(if running > 0 {
            Wanted::To(RouteWeight {
                deployment_id: deployment.id.clone(),
                weight: ROUTE_WEIGHT_ALL,
                port,
            })
        } else {
            Wanted::Pending(deployment.id.clone())
        })
    }

    /// Writes the route of (`environment_id`, `region`) as `wanted` says,
    /// as a new version only if it changes.
    fn write_route(
        &mut self,
        owner: &Deployment,
        environment_id: &str,
        region: &str,
        wanted: Wanted,
    ) -> Result<()> {
        let existing = self.route_row(environment_id, region)?;
        let (backends, pending) = {
            let current = existing.as_ref().map(|r| r.backends.clone());
            match wanted {
                Wanted::To(weight) => (vec![weight], None),
                Wanted::Pending(id) => (current.unwrap_or_default(), Some(id)),
                Wanted::Keep => (current.unwrap_or_default(), None),
                Wanted::Nothing => (Vec::new(), None),
            }
        };
        if let Some(route) = &existing
            && route.backends == backends
            && route.pending_deployment_id == pending
        {
            return Ok(());
        }
        if existing.is_none() && backends.is_empty() && pending.is_none() {
            return Ok(());
        }
        let id = route_id(environment_id, region);
        // The sentinel that serves it: the environment's in the region (a
        // sentinel applied by an operator may have another id), else the
        // one a deploy would create.
        let likely = sentinel_id(environment_id, region);
        let sentinel_name = find_environment_sentinel(
            &self.t.sentinels,
            &self.t.environment_sentinels,
            environment_id,
            region,
            &likely,
        )?
        .map_or_else(|| sentinel_k8s_name(&likely), |s| s.k8s_name);
        let backends_changed = existing.as_ref().is_none_or(|r| r.backends != backends);
        let mut route = existing.unwrap_or_else(|| Route {
            id: id.clone(),
            workspace_id: owner.workspace_id.clone(),
            project_id: owner.project_id.clone(),
            environment_id: environment_id.to_string(),
            region: region.to_string(),
            sentinel_k8s_name: String::new(),
            k8s_name: String::new(),
            k8s_namespace: SENTINEL_NAMESPACE.to_string(),
            backends: Vec::new(),
            pending_deployment_id: None,
            version: 0,
            created_at_ms: self.now_ms,
            updated_at_ms: self.now_ms,
        });
        route.k8s_name = sentinel_routes(&sentinel_name);
        route.sentinel_k8s_name = sentinel_name;
        route.backends = backends;
        route.pending_deployment_id = pending;
        if backends_changed {
            route.updated_at_ms = self.now_ms;
        }
        route.version = self.record_change(ResourceType::Route, &id, region)?;
        let bytes = encode("a route", &route)?;
        self.t
            .routes
            .insert((region, id.as_str()), bytes.as_slice())
            .ctx_table(OP, name::ROUTES)?;
        Ok(())
    }

    /// After instances of `deployment` in `region` were reported: the
    /// route waiting for it there flips to it once one of them runs.
    pub(super) fn route_instances_reported(
        &mut self,
        deployment: &Deployment,
        region: &str,
    ) -> Result<()> {
        let Some(route) = self.route_row(&deployment.environment_id, region)? else {
            return Ok(());
        };
        if route.pending_deployment_id.as_deref() != Some(deployment.id.as_str()) {
            return Ok(());
        }
        let wanted = self.wanted(deployment, region)?;
        if matches!(wanted, Wanted::To(_)) {
            self.write_route(deployment, &deployment.environment_id, region, wanted)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
