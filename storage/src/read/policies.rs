//! Cilium network policies, and krane's reports on what it applied (or
//! what Kubernetes rejected) of any resource.

use std::ops::Bound;

use redb::ReadableTable;
use wire::model::{ApplyReport, CiliumNetworkPolicy, Pk, ResourceKey, ResourceType};

use super::{OP, ReadView, scan_region};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, load, name};

impl ReadView {
    /// krane's latest report on policy `policy_id` in `region` (applied,
    /// or rejected by Kubernetes), if any.
    pub fn policy_applied(&self, policy_id: &str, region: &str) -> Result<Option<ApplyReport>> {
        self.apply_report(&ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: policy_id.into(),
            region: region.into(),
        })
    }

    /// krane's latest report on the resource `key` (a policy applied, or a
    /// version of any resource Kubernetes rejected), if any.
    pub fn apply_report(&self, key: &ResourceKey) -> Result<Option<ApplyReport>> {
        let report: Option<ApplyReport> = load(
            &self.policy_applied,
            name::POLICY_APPLIED,
            (key.region.as_str(), key.resource_id.as_str()),
        )?;
        Ok(report.filter(|r| r.key.resource_type == key.resource_type))
    }

    /// Kubernetes' rejection of the resource `key` at `version` or later,
    /// as krane reported it: `None` unless its current version was
    /// rejected.
    pub fn rejected(&self, key: &ResourceKey, version: Pk) -> Result<Option<ApplyReport>> {
        Ok(self
            .apply_report(key)?
            .filter(|r| !r.outcome.is_applied() && r.version >= version))
    }

    /// The cilium policy `id` of `region`, if it exists.
    pub fn policy(&self, id: &str, region: &str) -> Result<Option<CiliumNetworkPolicy>> {
        load(&self.policies, name::CILIUM_NETWORK_POLICIES, (region, id))
    }

    /// Cilium policies of every region in (region, id) order, after
    /// `after` (exclusive), at most `limit`.
    pub fn list_policies(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<CiliumNetworkPolicy>> {
        let start = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let range = self
            .policies
            .range::<(&str, &str)>((start, Bound::Unbounded))
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
            out.push(decode(
                name::CILIUM_NETWORK_POLICIES,
                &key.value(),
                value.value(),
            )?);
        }
        Ok(out)
    }

    /// The cilium policies of `region` in id order, at most `limit`.
    pub fn region_policies(&self, region: &str, limit: usize) -> Result<Vec<CiliumNetworkPolicy>> {
        scan_region(
            &self.policies,
            name::CILIUM_NETWORK_POLICIES,
            region,
            Bound::Unbounded,
            limit,
        )
    }

    /// The cilium policy with this id in any region (a whole-table read,
    /// as [`ReadView::find_sentinel`]).
    pub fn find_policy(&self, id: &str) -> Result<Option<CiliumNetworkPolicy>> {
        let table = name::CILIUM_NETWORK_POLICIES;
        for entry in self.policies.iter().ctx_table(OP, table)? {
            let (key, value) = entry.ctx_table(OP, table)?;
            if key.value().1 == id {
                return decode(table, &key.value(), value.value()).map(Some);
            }
        }
        Ok(None)
    }
}
