//! The change log: every write of desired state gets the next pk, a change
//! row (a pointer to the resource, never its state) and a region index row;
//! compaction deletes the oldest rows in bounded steps and raises the floor,
//! so the live rows stay exactly `floor_pk + 1 ..= last_pk`; the same step
//! deletes the request records past their retention (`apply::requests`).
use redb::ReadableTable;
use wire::model::{Pk, ResourceType, UnixMs};

use super::{Applier, OP, bad_request};
use crate::command::{COMPACT_ROWS_MAX, MutationResult, Outcome};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{self, ChangeRow, encode, meta, name};

impl Applier<'_> {
    /// Assigns the next pk and writes its change row and index row.
    pub(super) fn record_change(
        &mut self,
        resource_type: ResourceType,
        resource_id: &str,
        region: &str,
    ) -> Result<Pk> {
        let pk = self.last_pk.checked_add(1).ok_or_else(|| {
            StorageError::corrupt(name::METADATA, &meta::LAST_PK, "the pk space is exhausted")
        })?;
        let row = ChangeRow {
            resource_type,
            resource_id: resource_id.to_string(),
            region: region.to_string(),
            created_at_ms: self.now_ms,
        };
        let bytes = encode("a change row", &row)?;
        self.t
            .changes
            .insert(pk, bytes.as_slice())
            .ctx_table(OP, name::CHANGES)?;
        self.t
            .region_changes
            .insert((region, pk), ())
            .ctx_table(OP, name::REGION_CHANGES)?;
        self.last_pk = pk;
        Ok(pk)
    }

    pub(super) fn compact(
        &mut self,
        created_before_ms: UnixMs,
        rows_max: u32,
        requests_created_before_ms: UnixMs,
        keep_rows_min: u64,
    ) -> Result<MutationResult> {
        if rows_max > COMPACT_ROWS_MAX {
            return Ok(bad_request(format!(
                "a compaction step deletes at most {COMPACT_ROWS_MAX} rows, not {rows_max}"
            )));
        }
        // The oldest rows, in pk order, while they are old enough and not
        // among the newest `keep_rows_min`: the log stays a contiguous
        // range `floor_pk + 1 ..= last_pk`.
        let deletable_up_to = self.last_pk.saturating_sub(keep_rows_min);
        let mut doomed: Vec<(Pk, String)> = Vec::new();
        for entry in self
            .t
            .changes
            .iter()
            .ctx_table(OP, name::CHANGES)?
            .take(rows_max as usize)
        {
            let (key, value) = entry.ctx_table(OP, name::CHANGES)?;
            if key.value() > deletable_up_to {
                break;
            }
            let row: ChangeRow = tables::decode(name::CHANGES, &key.value(), value.value())?;
            if row.created_at_ms >= created_before_ms {
                break;
            }
            doomed.push((key.value(), row.region));
        }
        for (pk, region) in &doomed {
            self.t.changes.remove(*pk).ctx_table(OP, name::CHANGES)?;
            let indexed = self
                .t
                .region_changes
                .remove((region.as_str(), *pk))
                .ctx_table(OP, name::REGION_CHANGES)?
                .is_some();
            if !indexed {
                return Err(StorageError::corrupt(
                    name::REGION_CHANGES,
                    &(region, pk),
                    "a change row had no index row",
                ));
            }
        }
        if let Some((pk, _)) = doomed.last() {
            self.floor_pk = self.floor_pk.max(*pk);
        }
        // The journal ages out by the same rule and bound (it grows far
        // slower than the change log: a few entries per deploy).
        self.compact_journal(created_before_ms, rows_max)?;
        let requests_deleted = self.expire_requests(requests_created_before_ms, rows_max)?;
        Ok(Ok(Outcome::Compacted {
            rows_deleted: doomed.len() as u64,
            floor_pk: self.floor_pk,
            requests_deleted,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;
    use crate::{Mutation, Outcome};

    #[test]
    fn compaction_deletes_the_oldest_rows_and_raises_the_floor() {
        let store = store();
        for (i, region) in ["eu", "us", "eu", "us", "eu"].iter().enumerate() {
            let now = 10 * (i as u64 + 1); // 10, 20, 30, 40, 50
            apply_one(
                &store,
                now,
                vec![Mutation::UpsertCiliumNetworkPolicy(policy(
                    &format!("p{i}"),
                    region,
                ))],
            );
        }
        let compact = |created_before_ms, rows_max| {
            Mutation::Compact(crate::mutations::Compact {
                created_before_ms,
                rows_max,
                requests_created_before_ms: 0,
                keep_rows_min: 0,
            })
        };
        // Old enough: the first four; at most two per step.
        let out = apply_one(&store, 60, vec![compact(45, 2)]);
        assert_eq!(
            out,
            vec![Ok(Outcome::Compacted {
                rows_deleted: 2,
                floor_pk: 2,
                requests_deleted: 0,
            })]
        );
        assert_eq!(
            all_changes(&store),
            vec![(3, "eu".into()), (4, "us".into()), (5, "eu".into())]
        );
        let out = apply_one(&store, 61, vec![compact(45, 10)]);
        assert_eq!(
            out,
            vec![Ok(Outcome::Compacted {
                rows_deleted: 2,
                floor_pk: 4,
                requests_deleted: 0,
            })]
        );
        // Nothing left that is old enough: the floor stays.
        let out = apply_one(&store, 62, vec![compact(45, 10), compact(100, 0)]);
        assert_eq!(
            out,
            vec![
                Ok(Outcome::Compacted {
                    rows_deleted: 0,
                    floor_pk: 4,
                    requests_deleted: 0,
                }),
                Ok(Outcome::Compacted {
                    rows_deleted: 0,
                    floor_pk: 4,
                    requests_deleted: 0,
                })
            ]
        );
        let view = store.read().unwrap();
        assert_eq!((view.floor_pk(), view.last_pk()), (4, 5));
        assert_eq!(view.changes_after("us", 0, 10).unwrap(), vec![]);
        assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
        // The policies themselves are untouched.
        assert_eq!(view.region_resources("us", None, 10).unwrap().len(), 2);
    }

    #[test]
    fn compaction_keeps_the_newest_rows_however_old() {
        let store = store();
        for i in 0..5u64 {
            apply_one(
                &store,
                10 + i,
                vec![Mutation::UpsertCiliumNetworkPolicy(policy(
                    &format!("p{i}"),
                    "eu",
                ))],
            );
        }
        // Every row is old enough (a clock far ahead), yet three stay.
        let compact = Mutation::Compact(crate::mutations::Compact {
            created_before_ms: u64::MAX,
            rows_max: 100,
            requests_created_before_ms: 0,
            keep_rows_min: 3,
        });
        let out = apply_one(&store, 1_000_000, vec![compact.clone(), compact]);
        assert_eq!(
            out,
            vec![
                Ok(Outcome::Compacted {
                    rows_deleted: 2,
                    floor_pk: 2,
                    requests_deleted: 0,
                }),
                Ok(Outcome::Compacted {
                    rows_deleted: 0,
                    floor_pk: 2,
                    requests_deleted: 0,
                })
            ]
        );
        assert_eq!(all_changes(&store).len(), 3);
    }

    #[test]
    fn applied_time_never_goes_backwards() {
        let store = store();
        apply_one(
            &store,
            5_000,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p0", "eu"))],
        );
        // A command stamped earlier (a clock jumped back) applies at 5,000.
        apply_one(
            &store,
            1_000,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
        );
        let view = store.read().unwrap();
        assert_eq!(view.stamp_ms(), 5_000);
        let times: Vec<u64> = view
            .changes_after("eu", 0, 10)
            .unwrap()
            .iter()
            .map(|(_, row)| row.created_at_ms)
            .collect();
        assert_eq!(times, vec![5_000, 5_000]);
        drop(view);
        apply_one(
            &store,
            7_000,
            vec![Mutation::UpsertCiliumNetworkPolicy(policy("p2", "eu"))],
        );
        assert_eq!(store.read().unwrap().stamp_ms(), 7_000);
    }
}
