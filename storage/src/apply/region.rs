//! Regions: the clusters deployments may be scheduled to. An operator adds
//! one (idempotent) and cordons or uncordons it; an agent's heartbeat
//! records its health and registers its region on the first one. A
//! deployment may name only known, schedulable regions
//! ([`Applier::unschedulable_regions`], checked by create). Regions are not
//! streamed to agents: no change rows.

use redb::ReadableTableMetadata;
use wire::model::{Heartbeat, Region, RegionSource};
use wire::operator::REGION_COUNT_MAX;

use super::{Applier, OP, bad_request, not_found};
use crate::command::{MutationResult, Outcome};
use crate::error::{RedbContext, Result};
use crate::tables::{encode, load, name};

impl Applier<'_> {
    fn region(&self, region: &str) -> Result<Option<Region>> {
        load(&self.t.regions, name::REGIONS, region)
    }

    fn put_region(&mut self, region: &Region) -> Result<()> {
        let bytes = encode("a region", region)?;
        self.t
            .regions
            .insert(region.name.as_str(), bytes.as_slice())
            .ctx_table(OP, name::REGIONS)?;
        Ok(())
    }

    /// A new region row, or the refusal when the name is not a region
    /// name or the cluster already knows [`REGION_COUNT_MAX`] regions.
    fn new_region(
        &self,
        region: &str,
        registered_by: RegionSource,
    ) -> Result<std::result::Result<Region, MutationResult>> {
        if let Err(e) = wire::operator::validate_region(region) {
            return Ok(Err(Err(e)));
        }
        let count = self.t.regions.len().ctx_table(OP, name::REGIONS)?;
        if usize::try_from(count).map_or(true, |count| count >= REGION_COUNT_MAX) {
            return Ok(Err(bad_request(format!(
                "the cluster already knows {REGION_COUNT_MAX} regions; region {region:?} is not added"
            ))));
        }
        Ok(Ok(Region {
            name: region.to_string(),
            schedulable: true,
            registered_by,
            created_at_ms: self.now_ms,
            last_heartbeat: None,
        }))
    }

    pub(super) fn add_region(&mut self, region: &str) -> Result<MutationResult> {
        if let Some(existing) = self.region(region)? {
            return Ok(Ok(Outcome::Region(existing)));
        }
        let row = match self.new_region(region, RegionSource::Operator)? {
            Ok(row) => row,
            Err(refused) => return Ok(refused),
        };
        self.put_region(&row)?;
        Ok(Ok(Outcome::Region(row)))
    }

    pub(super) fn set_region_schedulable(
        &mut self,
        region: &str,
        schedulable: bool,
    ) -> Result<MutationResult> {
        let Some(mut row) = self.region(region)? else {
            return Ok(not_found(format!("no region {region:?}")));
        };
        if row.schedulable != schedulable {
            row.schedulable = schedulable;
            self.put_region(&row)?;
        }
        Ok(Ok(Outcome::Region(row)))
    }

    /// Records `heartbeat` as the region's last, stamped with the
    /// command's time; registers the region (schedulable) on its first.
    pub(super) fn record_heartbeat(
        &mut self,
        region: &str,
        heartbeat: &Heartbeat,
    ) -> Result<MutationResult> {
        if let Err(e) = heartbeat.validate() {
            return Ok(Err(e));
        }
        let mut row = match self.region(region)? {
            Some(row) => row,
            None => match self.new_region(region, RegionSource::Heartbeat)? {
                Ok(row) => row,
                Err(refused) => return Ok(refused),
            },
        };
        let mut heartbeat = heartbeat.clone();
        heartbeat.at_ms = self.now_ms;
        row.last_heartbeat = Some(heartbeat);
        self.put_region(&row)?;
        Ok(Ok(Outcome::Recorded))
    }

    /// The regions of `regions` a deployment may not name, each with why:
    /// unknown, or cordoned. Empty when every one is schedulable.
    pub(super) fn unschedulable_regions(&self, regions: &[String]) -> Result<Vec<String>> {
        let mut refused = Vec::new();
        for region in regions {
            if let Some(reason) = Region::unschedulable(self.region(region)?.as_ref()) {
                refused.push(format!("{region:?} is {reason}"));
            }
        }
        Ok(refused)
    }
}

#[cfg(test)]
mod tests;
