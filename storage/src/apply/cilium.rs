//! Cilium network policies: an upsert creates or replaces the row with a new
//! version and a change row; a delete removes the row and writes a change
//! row, which (like every older row of the policy) streams as a delete;
//! krane's report that it applied a version is kept until the policy goes.
//! krane's reports of versions Kubernetes rejected, of any resource, are
//! kept in the same table (the latest report per resource).

use wire::model::{ApplyReport, CiliumNetworkPolicy, DeploymentTopology, ResourceType, Sentinel};

use super::{Applier, OP, bad_request, not_found};
use crate::command::{MutationResult, Outcome};
use crate::error::{RedbContext, Result};
use crate::tables::{encode, load, name};

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
        };
        if key.resource_type != ResourceType::CiliumNetworkPolicy && result.outcome.is_applied() {
            return Ok(bad_request(format!(
                "applies are reported for cilium network policies, rejections for any \
                 resource; not an apply of a {}",
                key.resource_type.as_str()
            )));
        }
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
        if key.resource_type == ResourceType::Sentinel
            && let Some(reason) = result.outcome.rejection()
        {
            self.sentinel_rejected(&key.resource_id, &key.region, *version, reason)?;
        }
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

    fn rejected(resource_type: ResourceType, id: &str, version: u64) -> Mutation {
        Mutation::ReportApply(wire::model::ApplyReport {
            key: ResourceKey {
                resource_type,
                resource_id: id.into(),
                region: "eu".into(),
            },
            version,
            outcome: wire::model::ApplyOutcome::Rejected {
                reason: "spec.x: Invalid value".into(),
                code: 422,
                field: Some("spec.x".into()),
            },
            at_ms: 6,
        })
    }

    #[test]
    fn a_rejection_of_any_resource_is_kept_against_its_version() {
        let store = store();
        apply_one(&store, 1, create("dep_a", &["eu"], 1));
        apply_one(
            &store,
            2,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
        );
        let key = |resource_type, id: &str| ResourceKey {
            resource_type,
            resource_id: id.into(),
            region: "eu".into(),
        };
        let topology = store
            .read()
            .unwrap()
            .topology("dep_a", "eu")
            .unwrap()
            .unwrap();
        let out = apply_one(
            &store,
            3,
            vec![
                rejected(ResourceType::DeploymentTopology, "dep_a", topology.version),
                // No such topology; a version it never had.
                rejected(ResourceType::DeploymentTopology, "dep_b", 1),
                rejected(
                    ResourceType::DeploymentTopology,
                    "dep_a",
                    topology.version + 9,
                ),
                rejected(ResourceType::CiliumNetworkPolicy, "p1", 2),
            ],
        );
        assert_eq!(out[0], Ok(Outcome::Recorded));
        assert_eq!(out[1].as_ref().unwrap_err().code, wire::ErrorCode::NotFound);
        assert_eq!(
            out[2].as_ref().unwrap_err().code,
            wire::ErrorCode::BadRequest
        );
        assert_eq!(out[3], Ok(Outcome::Recorded));
        let view = store.read().unwrap();
        let found = view
            .rejected(
                &key(ResourceType::DeploymentTopology, "dep_a"),
                topology.version,
            )
            .unwrap()
            .expect("the rejection");
        assert_eq!(
            found.outcome.rejection().unwrap(),
            "Kubernetes refused it (422): spec.x: Invalid value"
        );
        // A later version is not the rejected one; another type's key is not it.
        assert!(
            view.rejected(
                &key(ResourceType::DeploymentTopology, "dep_a"),
                topology.version + 1
            )
            .unwrap()
            .is_none()
        );
        assert!(
            view.apply_report(&key(ResourceType::Sentinel, "dep_a"))
                .unwrap()
                .is_none()
        );
        // The policy's rejection replaced nothing applied; a newer applied
        // version replaces the rejection.
        assert!(
            view.rejected(&key(ResourceType::CiliumNetworkPolicy, "p1"), 2)
                .unwrap()
                .is_some()
        );
        drop(view);
        apply_one(
            &store,
            4,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
        );
        apply_one(&store, 5, vec![applied_at("p1", 3)]);
        let view = store.read().unwrap();
        assert!(
            view.rejected(&key(ResourceType::CiliumNetworkPolicy, "p1"), 3)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            view.policy_applied("p1", "eu").unwrap().map(|a| a.version),
            Some(3)
        );
    }

    #[test]
    fn a_rejected_sentinel_version_fails_its_deploy() {
        let store = store();
        let out = apply_one(
            &store,
            1,
            vec![Mutation::DeploySentinel {
                sentinel: sentinel("s1", "eu"),
                deadline_ms: 600_000,
            }],
        );
        let Ok(Outcome::SentinelDeployed { version, .. }) = out[0] else {
            panic!("{out:?}");
        };
        // A rejection of an older version changes nothing.
        apply_one(
            &store,
            2,
            vec![rejected(ResourceType::Sentinel, "s1", version - 1)],
        );
        let row = store.read().unwrap().sentinel("s1", "eu").unwrap().unwrap();
        assert_eq!(
            row.deploy.status,
            wire::model::SentinelDeployStatus::Progressing
        );
        apply_one(
            &store,
            3,
            vec![rejected(ResourceType::Sentinel, "s1", version)],
        );
        let row = store.read().unwrap().sentinel("s1", "eu").unwrap().unwrap();
        assert_eq!(row.deploy.status, wire::model::SentinelDeployStatus::Failed);
        assert_eq!(row.deploy.ended_at_ms, Some(3));
        assert_eq!(
            row.deploy.reason.as_deref(),
            Some("Kubernetes refused it (422): spec.x: Invalid value")
        );
    }
}
