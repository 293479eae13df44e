//! Sentinels (one per environment and region) and the status krane last
//! reported for each.

use std::ops::Bound;

use redb::ReadableTable;
use wire::model::{Sentinel, SentinelStatus};

use super::{OP, ReadView, scan_region};
use crate::error::{RedbContext, Result};
use crate::tables::{Bytes, RegionKey, decode, load, name};

impl ReadView {
    /// The sentinel `id` of `region`, if it exists.
    pub fn sentinel(&self, id: &str, region: &str) -> Result<Option<Sentinel>> {
        load(&self.sentinels, name::SENTINELS, (region, id))
    }

    /// The status krane last reported for a sentinel in a region, if any.
    pub fn sentinel_status(
        &self,
        sentinel_id: &str,
        region: &str,
    ) -> Result<Option<SentinelStatus>> {
        load(
            &self.sentinel_status,
            name::SENTINEL_STATUS,
            (region, sentinel_id),
        )
    }

    /// The sentinels of `region` in id order, at most `limit`.
    pub fn region_sentinels(&self, region: &str, limit: usize) -> Result<Vec<Sentinel>> {
        scan_region(
            &self.sentinels,
            name::SENTINELS,
            region,
            Bound::Unbounded,
            limit,
        )
    }

    /// The sentinel of `environment_id` in `region`, if it has one (one
    /// per environment per region). `likely_id` is the id it most likely
    /// has (the one deploys and applies give it): looked up first, so
    /// finding it costs one read whatever the region holds; only when it
    /// is not there are the region's sentinels scanned.
    pub fn environment_sentinel(
        &self,
        environment_id: &str,
        region: &str,
        likely_id: &str,
    ) -> Result<Option<Sentinel>> {
        find_environment_sentinel(&self.sentinels, environment_id, region, likely_id)
    }

    /// The sentinel with this id in any region. Rows are keyed by region
    /// first, so this reads the whole table: fine for operator calls on a
    /// table of one sentinel per environment and region.
    pub fn find_sentinel(&self, id: &str) -> Result<Option<Sentinel>> {
        for entry in self.sentinels.iter().ctx_table(OP, name::SENTINELS)? {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            if key.value().1 == id {
                return decode(name::SENTINELS, &key.value(), value.value()).map(Some);
            }
        }
        Ok(None)
    }

    /// Sentinels of every region in (region, id) order, after `after`
    /// (exclusive), at most `limit`.
    pub fn sentinels(&self, after: Option<(&str, &str)>, limit: usize) -> Result<Vec<Sentinel>> {
        let mut out = Vec::new();
        let lower = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let range = self
            .sentinels
            .range::<(&str, &str)>((lower, Bound::Unbounded))
            .ctx_table(OP, name::SENTINELS)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
            out.push(decode(name::SENTINELS, &key.value(), value.value())?);
        }
        Ok(out)
    }
}

/// The sentinel of `environment_id` in `region` in `table`: the one at
/// `likely_id` if it is the environment's, else the first of the region's
/// that is (see [`ReadView::environment_sentinel`]).
pub(crate) fn find_environment_sentinel(
    table: &impl ReadableTable<RegionKey, Bytes>,
    environment_id: &str,
    region: &str,
    likely_id: &str,
) -> Result<Option<Sentinel>> {
    if let Some(sentinel) =
        load::<RegionKey, Sentinel>(table, name::SENTINELS, (region, likely_id))?
        && sentinel.environment_id == environment_id
    {
        return Ok(Some(sentinel));
    }
    let range = table
        .range::<(&str, &str)>((region, "")..)
        .ctx_table(OP, name::SENTINELS)?;
    for entry in range {
        let (key, value) = entry.ctx_table(OP, name::SENTINELS)?;
        if key.value().0 != region {
            break;
        }
        let sentinel: Sentinel = decode(name::SENTINELS, &key.value(), value.value())?;
        if sentinel.environment_id == environment_id {
            return Ok(Some(sentinel));
        }
    }
    Ok(None)
}
