//! Cilium network policies: an upsert creates or replaces the row with a new
//! version and a change row; a delete removes the row and writes a change
//! row, which (like every older row of the policy) streams as a delete;
//! krane's report that it applied a version is kept until the policy goes.
//! krane's reports of versions Kubernetes rejected, of any resource, are
//! kept in the same table (the latest report per resource).

use wire::model::{
    ApplyReport, CiliumNetworkPolicy, DeploymentTopology, ResourceType, Route, Sentinel,
};

use super::{Applier, OP, bad_request, conflict, not_found};
use crate::command::{MutationResult, Outcome, Touched};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, encode, load, name};
use redb::ReadableTable;

impl Applier<'_> {
    /// An operator's policy (`ctrl policy apply`): refused when another
    /// policy of the region (another environment's) holds its namespace
    /// and name, since one Kubernetes object has one owner; else upserted.
    /// Found by key ([`crate::tables::POLICIES_BY_NAME`]). A deploy's own
    /// policies skip the check: their names carry the fresh deployment id.
    pub(super) fn upsert_operator_policy(
        &mut self,
        policy: &CiliumNetworkPolicy,
    ) -> Result<MutationResult> {
        let mut holder = None;
        let wanted = (
            policy.region.as_str(),
            policy.k8s_namespace.as_str(),
            policy.k8s_name.as_str(),
        );
        for entry in self
            .t
            .policies_by_name
            .range::<(&str, &str, &str, &str)>((wanted.0, wanted.1, wanted.2, "")..)
            .ctx_table(OP, name::POLICIES_BY_NAME)?
        {
            let (key, _) = entry.ctx_table(OP, name::POLICIES_BY_NAME)?;
            let (region, namespace, k8s_name, id) = key.value();
            if (region, namespace, k8s_name) != wanted {
                break;
            }
            if id != policy.id {
                holder = load::<_, CiliumNetworkPolicy>(
                    &self.t.policies,
                    name::CILIUM_NETWORK_POLICIES,
                    (region, id),
                )?;
                break;
            }
        }
        if let Some(holder) = holder {
            return Ok(conflict(format!(
                "network policy {}/{} in region {} is already environment {}'s (policy {}): \
                 one Kubernetes object has one owner; give this one another name",
                policy.k8s_namespace,
                policy.k8s_name,
                policy.region,
                holder.environment_id,
                holder.id
            )));
        }
        self.upsert_policy(policy)
    }

    pub(super) fn upsert_policy(&mut self, policy: &CiliumNetworkPolicy) -> Result<MutationResult> {
        if policy.id.is_empty() || policy.region.is_empty() {
            return Ok(bad_request("a policy needs an id and a region"));
        }
        let key = (policy.region.as_str(), policy.id.as_str());
        let existing: Option<CiliumNetworkPolicy> =
            load(&self.t.policies, name::CILIUM_NETWORK_POLICIES, key)?;
        let mut row = policy.clone();
        row.version = self.record_change(
            ResourceType::CiliumNetworkPolicy,
            &policy.id,
            &policy.region,
        )?;
        if let Some(was) = &existing {
            self.t
                .policies_by_name
                .remove(policy_name_key(was))
                .ctx_table(OP, name::POLICIES_BY_NAME)?;
        }
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        let bytes = encode("a cilium network policy", &row)?;
        self.t
            .policies
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
        self.t
            .policies_by_name
            .insert(policy_name_key(&row), ())
            .ctx_table(OP, name::POLICIES_BY_NAME)?;
        self.touch(Touched::Environment(row.environment_id.clone()));
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn delete_policy(&mut self, id: &str, region: &str) -> Result<MutationResult> {
        let removed = self
            .t
            .policies
            .remove((region, id))
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?
            .map(|old| {
                decode::<CiliumNetworkPolicy>(
                    name::CILIUM_NETWORK_POLICIES,
                    &(region, id),
                    old.value(),
                )
            })
            .transpose()?;
        let Some(removed) = removed else {
            // Nothing was written: the remove found no row.
            return Ok(not_found(format!(
                "no cilium network policy {id:?} in region {region:?}"
            )));
        };
        self.t
            .policies_by_name
            .remove(policy_name_key(&removed))
            .ctx_table(OP, name::POLICIES_BY_NAME)?;
        self.touch(Touched::Environment(removed.environment_id));
        self.t
            .policy_applied
            .remove((region, id))
            .ctx_table(OP, name::POLICY_APPLIED)?;
        self.record_change(ResourceType::CiliumNetworkPolicy, id, region)?;
        Ok(Ok(Outcome::Recorded))
    }

    /// krane's report on one version of a resource: the latest per
    /// resource is kept in `policy_applied` (keyed by region and resource
    /// id: ids are prefixed by their type, so they never collide). Every
    /// policy version applied is reported; a version of any resource that
    /// Kubernetes rejected is reported too. A rejection of a sentinel's
    /// current version fails its deploy in progress, in this same apply.
    pub(super) fn report_apply(&mut self, result: &ApplyReport) -> Result<MutationResult> {
        let ApplyReport { key, version, .. } = result;
        let row = (key.region.as_str(), key.resource_id.as_str());
        let current = match key.resource_type {
            ResourceType::CiliumNetworkPolicy => {
                let p: Option<CiliumNetworkPolicy> =
                    load(&self.t.policies, name::CILIUM_NETWORK_POLICIES, row)?;
                p.map(|p| p.version)
            }
            ResourceType::DeploymentTopology => {
                let t: Option<DeploymentTopology> =
                    load(&self.t.topology, name::DEPLOYMENT_TOPOLOGY, row)?;
                t.map(|t| t.version)
            }
            ResourceType::Sentinel => {
                let s: Option<Sentinel> = load(&self.t.sentinels, name::SENTINELS, row)?;
                s.map(|s| s.version)
            }
            ResourceType::Route => {
                let r: Option<Route> = load(&self.t.routes, name::ROUTES, row)?;
                r.map(|r| r.version)
            }
        };
        // A route is "applied" once its sentinel's pods serve its version.
        if !matches!(
            key.resource_type,
            ResourceType::CiliumNetworkPolicy | ResourceType::Route
        ) && result.outcome.is_applied()
        {
            return Ok(bad_request(format!(
                "applies are reported for cilium network policies and routes, rejections \
                 for any resource; not an apply of a {}",
                key.resource_type.as_str()
            )));
        }
        // A refusal of a resource ctrl no longer has is a delete
        // Kubernetes refused: recorded all the same (an operator must
        // remove the object by hand).
        let current = match current {
            None if !result.outcome.is_applied() => Some(*version),
            current => current,
        };
        let Some(current) = current else {
            return Ok(not_found(format!(
                "no {} {:?} in region {:?}",
                key.resource_type.as_str(),
                key.resource_id,
                key.region
            )));
        };
        if *version > current {
            return Ok(bad_request(format!(
                "{} {:?} in region {:?} has version {current}, not {version}",
                key.resource_type.as_str(),
                key.resource_id,
                key.region
            )));
        }
        let recorded: Option<ApplyReport> =
            load(&self.t.policy_applied, name::POLICY_APPLIED, row)?;
        if recorded
            .is_some_and(|r| r.key.resource_type == key.resource_type && r.version >= *version)
        {
            return Ok(Ok(Outcome::Recorded));
        }
        let bytes = encode("an apply report", result)?;
        self.t
            .policy_applied
            .insert(row, bytes.as_slice())
            .ctx_table(OP, name::POLICY_APPLIED)?;
        self.touch(touched_by_report(key));
        if key.resource_type == ResourceType::Sentinel
            && let Some(reason) = result.outcome.rejection()
        {
            self.sentinel_rejected(&key.resource_id, &key.region, *version, reason)?;
        }
        Ok(Ok(Outcome::Recorded))
    }
}

#[cfg(test)]
mod tests;

/// The record krane's report on `key` concerns.
fn touched_by_report(key: &wire::model::ResourceKey) -> Touched {
    let (region, id) = (key.region.clone(), key.resource_id.clone());
    match key.resource_type {
        ResourceType::DeploymentTopology => Touched::Deployment(id),
        ResourceType::Sentinel => Touched::Sentinel { region, id },
        _ => Touched::Policy { region, id },
    }
}

/// `policy`'s row of [`crate::tables::POLICIES_BY_NAME`].
pub(crate) fn policy_name_key(policy: &CiliumNetworkPolicy) -> (&str, &str, &str, &str) {
    (
        policy.region.as_str(),
        policy.k8s_namespace.as_str(),
        policy.k8s_name.as_str(),
        policy.id.as_str(),
    )
}
