//! Cilium network policies: an upsert creates or replaces the row with a new
//! version and a change row; a delete removes the row and writes a change
//! row, which (like every older row of the policy) streams as a delete.

use wire::model::{CiliumNetworkPolicy, ResourceType};

use super::{Applier, OP, bad_request, not_found};
use crate::command::{MutationResult, Outcome};
use crate::error::{RedbContext, Result};
use crate::read::load;
use crate::tables::{encode, name};

impl Applier<'_> {
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
        row.created_at_ms = existing.map_or(self.now_ms, |e| e.created_at_ms);
        row.updated_at_ms = self.now_ms;
        let bytes = encode("a cilium network policy", &row)?;
        self.t
            .policies
            .insert(key, bytes.as_slice())
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn delete_policy(&mut self, id: &str, region: &str) -> Result<MutationResult> {
        let removed = self
            .t
            .policies
            .remove((region, id))
            .ctx_table(OP, name::CILIUM_NETWORK_POLICIES)?
            .is_some();
        if !removed {
            // Nothing was written: the remove found no row.
            return Ok(not_found(format!(
                "no cilium network policy {id:?} in region {region:?}"
            )));
        }
        self.record_change(ResourceType::CiliumNetworkPolicy, id, region)?;
        Ok(Ok(Outcome::Recorded))
    }
}

#[cfg(test)]
mod tests {
    use wire::agent::ResourceChange;
    use wire::model::{ResourceKey, ResourceType};

    use crate::test_support::*;
    use crate::{Mutation, Outcome};

    #[test]
    fn a_deleted_policy_streams_as_a_delete() {
        let store = store();
        apply_one(
            &store,
            1,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
        );
        let out = apply_one(
            &store,
            2,
            vec![Mutation::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            }],
        );
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
        let view = store.read().unwrap();
        let rows = view.changes_after("eu", 0, 10).unwrap();
        assert_eq!(rows.iter().map(|(pk, _)| *pk).collect::<Vec<_>>(), [1, 2]);
        let key = ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: "p1".into(),
            region: "eu".into(),
        };
        // Both rows, the old upsert included, now stream as the delete.
        for (_, row) in &rows {
            assert_eq!(
                view.change_event(row).unwrap(),
                ResourceChange::Delete(key.clone())
            );
        }
    }
}
