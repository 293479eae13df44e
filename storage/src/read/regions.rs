//! Regions: the ones operators registered and those agents' heartbeats
//! did.

use redb::ReadableTable;
use wire::model::Region;

use super::{OP, ReadView};
use crate::error::{RedbContext, Result};
use crate::tables::{decode, load, name};

impl ReadView {
    /// The region `region_name`, if it is known.
    pub fn region(&self, region_name: &str) -> Result<Option<Region>> {
        load(&self.regions, name::REGIONS, region_name)
    }

    /// Every known region, in name order (at most
    /// [`wire::operator::REGION_COUNT_MAX`], which apply enforces).
    pub fn list_regions(&self) -> Result<Vec<Region>> {
        let mut out = Vec::new();
        let rows = self.regions.iter().ctx_table(OP, name::REGIONS)?;
        for entry in rows.take(wire::operator::REGION_COUNT_MAX) {
            let (key, value) = entry.ctx_table(OP, name::REGIONS)?;
            out.push(decode(name::REGIONS, &key.value(), value.value())?);
        }
        Ok(out)
    }
}
