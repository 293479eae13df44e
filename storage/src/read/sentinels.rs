//! Sentinels (one per environment and region) and the status krane last
//! reported for each.

use std::ops::Bound;

use redb::ReadableTable;
use wire::model::{Sentinel, SentinelStatus};

use super::{OP, ReadView, scan_region};
use crate::error::{RedbContext, Result, StorageError};
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
    /// per environment per region): found by key, whatever the region
    /// holds (the index by environment, or the likely id).
    pub fn environment_sentinel(
        &self,
        environment_id: &str,
        region: &str,
        likely_id: &str,
    ) -> Result<Option<Sentinel>> {
        find_environment_sentinel(
            &self.sentinels,
            &self.environment_sentinels,
            environment_id,
            region,
            likely_id,
        )
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

/// The sentinel of `environment_id` in `region`: the one with `likely_id`
/// (the id deploys and applies give it) if it names the environment, else
/// the one the [`crate::tables::ENVIRONMENT_SENTINELS`] index names. Two reads
/// at most, whatever the region holds.
pub(crate) fn find_environment_sentinel(
    sentinels: &impl ReadableTable<RegionKey, Bytes>,
    index: &impl ReadableTable<RegionKey, &'static str>,
    environment_id: &str,
    region: &str,
    likely_id: &str,
) -> Result<Option<Sentinel>> {
    if let Some(sentinel) =
        load::<RegionKey, Sentinel>(sentinels, name::SENTINELS, (region, likely_id))?
        && sentinel.environment_id == environment_id
    {
        return Ok(Some(sentinel));
    }
    let Some(id) = index
        .get((region, environment_id))
        .ctx_table(OP, name::ENVIRONMENT_SENTINELS)?
    else {
        return Ok(None);
    };
    let id = id.value().to_string();
    let sentinel: Option<Sentinel> = load(sentinels, name::SENTINELS, (region, id.as_str()))?;
    match sentinel {
        Some(sentinel) if sentinel.environment_id == environment_id => Ok(Some(sentinel)),
        _ => Err(StorageError::corrupt(
            name::ENVIRONMENT_SENTINELS,
            &(region, environment_id),
            format!("names sentinel {id}, which is not the environment's"),
        )),
    }
}

/// Keeps the [`crate::tables::ENVIRONMENT_SENTINELS`] row of `sentinel`'s
/// environment and region naming the lowest id of the sentinels that name
/// them, as `sentinel` is written (apply takes back the row of an
/// environment a sentinel stops naming: `Applier::put_sentinel`).
pub(crate) fn index_environment_sentinel(
    index: &mut redb::Table<'_, RegionKey, &'static str>,
    sentinel: &Sentinel,
    op: &'static str,
) -> Result<()> {
    let key = (sentinel.region.as_str(), sentinel.environment_id.as_str());
    let keep = index
        .get(key)
        .ctx_table(op, name::ENVIRONMENT_SENTINELS)?
        .is_some_and(|id| id.value() <= sentinel.id.as_str());
    if !keep {
        index
            .insert(key, sentinel.id.as_str())
            .ctx_table(op, name::ENVIRONMENT_SENTINELS)?;
    }
    Ok(())
}
