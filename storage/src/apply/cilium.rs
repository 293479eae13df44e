//! Cilium network policies: an upsert creates or replaces the row with a new
//! version and a change row; a delete removes the row and writes a change
//! row, which (like every older row of the policy) streams as a delete;
//! krane's report that it applied a version is kept until the policy goes.

use wire::model::{ApplyReport, CiliumNetworkPolicy, ResourceType};

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
        self.t
            .policy_applied
            .remove((region, id))
            .ctx_table(OP, name::POLICY_APPLIED)?;
        self.record_change(ResourceType::CiliumNetworkPolicy, id, region)?;
        Ok(Ok(Outcome::Recorded))
    }

    pub(super) fn report_apply(&mut self, result: &ApplyReport) -> Result<MutationResult> {
        let ApplyReport { key, version, .. } = result;
        if key.resource_type != ResourceType::CiliumNetworkPolicy {
            return Ok(bad_request(format!(
                "apply results are recorded for cilium network policies, not {}",
                key.resource_type.as_str()
            )));
        }
        let row = (key.region.as_str(), key.resource_id.as_str());
        let policy: Option<CiliumNetworkPolicy> =
            load(&self.t.policies, name::CILIUM_NETWORK_POLICIES, row)?;
        let Some(policy) = policy else {
            return Ok(not_found(format!(
                "no cilium network policy {:?} in region {:?}",
                key.resource_id, key.region
            )));
        };
        if *version > policy.version {
            return Ok(bad_request(format!(
                "policy {:?} in region {:?} has version {}, not {version}",
                key.resource_id, key.region, policy.version
            )));
        }
        let recorded: Option<ApplyReport> =
            load(&self.t.policy_applied, name::POLICY_APPLIED, row)?;
        if recorded.is_some_and(|r| r.version >= *version) {
            return Ok(Ok(Outcome::Recorded));
        }
        let bytes = encode("a policy's applied version", result)?;
        self.t
            .policy_applied
            .insert(row, bytes.as_slice())
            .ctx_table(OP, name::POLICY_APPLIED)?;
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

    fn applied(id: &str, region: &str, version: u64) -> Mutation {
        Mutation::ReportApply(wire::model::ApplyReport {
            key: ResourceKey {
                resource_type: ResourceType::CiliumNetworkPolicy,
                resource_id: id.into(),
                region: region.into(),
            },
            version,
            outcome: wire::model::ApplyOutcome::Applied,
            at_ms: 5,
        })
    }

    fn applied_version(store: &crate::Store) -> Option<u64> {
        let view = store.read().unwrap();
        view.policy_applied("p1", "eu").unwrap().map(|a| a.version)
    }

    #[test]
    fn the_newest_applied_version_is_kept_until_the_policy_goes() {
        let store = store();
        let upsert = || vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))];
        apply_one(&store, 1, upsert());
        apply_one(&store, 2, upsert());
        // No policy there; a version it never had: nothing written.
        let out = apply_one(&store, 3, vec![applied("p2", "eu", 1), applied_at("p1", 1)]);
        assert_eq!(out[0].as_ref().unwrap_err().code, wire::ErrorCode::NotFound);
        assert_eq!(out[1], Ok(Outcome::Recorded));
        let out = apply_one(&store, 3, vec![applied_at("p1", 3)]);
        assert_eq!(
            out[0].as_ref().unwrap_err().code,
            wire::ErrorCode::BadRequest
        );
        assert_eq!(applied_version(&store), Some(1));
        // Newer is kept; an older one arriving late changes nothing.
        apply_one(&store, 4, vec![applied_at("p1", 2), applied_at("p1", 1)]);
        assert_eq!(applied_version(&store), Some(2));
        // Only policies are reported.
        let mut other = applied_at("p1", 1);
        if let Mutation::ReportApply(report) = &mut other {
            report.key.resource_type = ResourceType::Sentinel;
        }
        let out = apply_one(&store, 5, vec![other]);
        assert_eq!(
            out[0].as_ref().unwrap_err().code,
            wire::ErrorCode::BadRequest
        );
        // The delete forgets it: a policy made again starts unapplied.
        apply_one(
            &store,
            6,
            vec![Mutation::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            }],
        );
        assert_eq!(applied_version(&store), None);
        apply_one(&store, 7, upsert());
        assert_eq!(applied_version(&store), None);
    }

    fn applied_at(id: &str, version: u64) -> Mutation {
        applied(id, "eu", version)
    }
}
