//! The change log as agents sync from it: a full sync's pages of a
//! region's live resources, the change rows of a region after a cursor,
//! and the event each row streams as (the resource's current state, or a
//! delete of its key).

use std::ops::Bound;

use redb::ReadableTable;
use wire::agent::ResourceChange;
use wire::model::{
    CiliumNetworkPolicy, DeploymentTopology, Pk, Resource, ResourceKey, ResourceType, Route,
    Sentinel, UnixMs,
};

use super::{OP, ReadView, scan_region};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{self, ChangeRow, load, name};

impl ReadView {
    /// A page of the live resources of `region` for a full sync, ordered by
    /// type (as in [`ResourceType::ALL`]) then id, starting after `after`
    /// (the key of the last resource of the previous page; its region is
    /// ignored). At most `limit` resources; fewer means the end.
    pub fn region_resources(
        &self,
        region: &str,
        after: Option<&ResourceKey>,
        limit: usize,
    ) -> Result<Vec<Resource>> {
        let mut out = Vec::new();
        for resource_type in ResourceType::ALL {
            let start = match after {
                Some(key) if key.resource_type > resource_type => continue,
                Some(key) if key.resource_type == resource_type => {
                    Bound::Excluded(key.resource_id.as_str())
                }
                _ => Bound::Included(""),
            };
            let room = limit - out.len();
            if room == 0 {
                break;
            }
            match resource_type {
                ResourceType::DeploymentTopology => out.extend(
                    scan_region::<DeploymentTopology>(
                        &self.topology,
                        name::DEPLOYMENT_TOPOLOGY,
                        region,
                        start,
                        room,
                    )?
                    .into_iter()
                    .map(Resource::DeploymentTopology),
                ),
                ResourceType::Sentinel => out.extend(
                    scan_region::<Sentinel>(&self.sentinels, name::SENTINELS, region, start, room)?
                        .into_iter()
                        .map(Resource::Sentinel),
                ),
                ResourceType::CiliumNetworkPolicy => out.extend(
                    scan_region::<CiliumNetworkPolicy>(
                        &self.policies,
                        name::CILIUM_NETWORK_POLICIES,
                        region,
                        start,
                        room,
                    )?
                    .into_iter()
                    .map(Resource::CiliumNetworkPolicy),
                ),
                ResourceType::Route => out.extend(
                    scan_region::<Route>(&self.routes, name::ROUTES, region, start, room)?
                        .into_iter()
                        .map(Resource::Route),
                ),
            }
        }
        Ok(out)
    }

    /// The change rows of `region` with `pk > after`, ascending, at most
    /// `limit`. Rows at or below [`Self::floor_pk`] may be missing: check the
    /// cursor against the floor first.
    pub fn changes_after(
        &self,
        region: &str,
        after: Pk,
        limit: usize,
    ) -> Result<Vec<(Pk, ChangeRow)>> {
        let Some(first) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let range = self
            .region_changes
            .range((region, first)..=(region, Pk::MAX))
            .ctx_table(OP, name::REGION_CHANGES)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::REGION_CHANGES)?;
            let (_, pk) = key.value();
            let row: ChangeRow = load(&self.changes, name::CHANGES, pk)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::REGION_CHANGES,
                    &key.value(),
                    "indexes a change row that does not exist",
                )
            })?;
            if row.region != region {
                return Err(StorageError::corrupt(
                    name::REGION_CHANGES,
                    &key.value(),
                    format!("indexes a change row of region {:?}", row.region),
                ));
            }
            out.push((pk, row));
        }
        Ok(out)
    }

    /// The event to stream for a change row: the resource's current state,
    /// or a delete of its key if it no longer exists. Never skipped.
    pub fn change_event(&self, row: &ChangeRow) -> Result<ResourceChange> {
        let key = row.key();
        Ok(match self.resource(&key)? {
            Some(resource) => ResourceChange::Apply(resource),
            None => ResourceChange::Delete(key),
        })
    }

    /// The current state of one resource of one region.
    pub fn resource(&self, key: &ResourceKey) -> Result<Option<Resource>> {
        let (id, region) = (key.resource_id.as_str(), key.region.as_str());
        Ok(match key.resource_type {
            ResourceType::DeploymentTopology => {
                self.topology(id, region)?.map(Resource::DeploymentTopology)
            }
            ResourceType::Sentinel => self.sentinel(id, region)?.map(Resource::Sentinel),
            ResourceType::CiliumNetworkPolicy => {
                self.policy(id, region)?.map(Resource::CiliumNetworkPolicy)
            }
            ResourceType::Route => self.route(id, region)?.map(Resource::Route),
        })
    }

    /// The time of the oldest change row still kept (`None`: the log is
    /// empty).
    pub fn oldest_change_ms(&self) -> Result<Option<UnixMs>> {
        let Some((key, value)) = self.changes.first().ctx_table(OP, name::CHANGES)? else {
            return Ok(None);
        };
        let row: ChangeRow = tables::decode(name::CHANGES, &key.value(), value.value())?;
        Ok(Some(row.created_at_ms))
    }
}
