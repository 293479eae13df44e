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
mod tests {
    use wire::ErrorCode;
    use wire::model::{FailedApply, Heartbeat, RegionSource, ResourceKey, ResourceType};

    use crate::test_support::*;
    use crate::{Mutation, Outcome, Store};

    fn heartbeat(cursor: u64) -> Heartbeat {
        Heartbeat {
            agent_version: "0.1.0".into(),
            cursor,
            interval_ms: 1_000,
            applied_resources: 2,
            failed_applies: vec![FailedApply::new(
                ResourceKey {
                    resource_type: ResourceType::Sentinel,
                    resource_id: "s1".into(),
                    region: "eu".into(),
                },
                "forbidden",
            )],
            // Replaced by the command's time.
            at_ms: 999_999,
        }
    }

    fn record(region: &str, cursor: u64) -> Mutation {
        Mutation::RecordHeartbeat {
            region: region.into(),
            heartbeat: heartbeat(cursor),
        }
    }

    fn hash(store: &Store) -> u64 {
        store.read().unwrap().state_hash().unwrap()
    }

    #[test]
    fn adding_a_region_is_idempotent() {
        let store = Store::in_memory().unwrap();
        let out = apply_one(&store, 5, vec![add_region("eu")]);
        let Ok(Outcome::Region(first)) = &out[0] else {
            panic!("{out:?}")
        };
        assert!(first.schedulable);
        assert_eq!(first.registered_by, RegionSource::Operator);
        assert_eq!(
            (first.created_at_ms, first.last_heartbeat.clone()),
            (5, None)
        );
        let before = hash(&store);
        let again = apply_one(&store, 9, vec![add_region("eu")]);
        assert_eq!(again, vec![Ok(Outcome::Region(first.clone()))]);
        assert_eq!(hash(&store), before, "a second add changes nothing");
        let bad = apply_one(&store, 9, vec![add_region("EU")]);
        assert_eq!(bad[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
        assert_eq!(store.read().unwrap().list_regions().unwrap().len(), 1);
    }

    #[test]
    fn the_first_heartbeat_registers_the_region_and_the_next_replace_it() {
        let store = Store::in_memory().unwrap();
        assert_eq!(
            apply_one(&store, 10, vec![record("eu", 3)]),
            vec![Ok(Outcome::Recorded)]
        );
        let region = store
            .read()
            .unwrap()
            .region("eu")
            .unwrap()
            .expect("registered");
        assert_eq!(region.registered_by, RegionSource::Heartbeat);
        assert!(region.schedulable);
        assert_eq!(region.created_at_ms, 10);
        let last = region.last_heartbeat.expect("a heartbeat");
        assert_eq!(
            (last.cursor, last.at_ms),
            (3, 10),
            "stamped with ctrl's time"
        );
        assert_eq!(last.failed_applies.len(), 1);

        apply_one(&store, 20, vec![record("eu", 8)]);
        let region = store.read().unwrap().region("eu").unwrap().unwrap();
        assert_eq!(region.created_at_ms, 10);
        let last = region.last_heartbeat.unwrap();
        assert_eq!((last.cursor, last.at_ms), (8, 20));
        // No change rows: regions are not streamed.
        assert_eq!(store.read().unwrap().last_pk(), 0);
    }

    #[test]
    fn a_heartbeat_out_of_bounds_writes_nothing() {
        let store = Store::in_memory().unwrap();
        let before = hash(&store);
        let mut bad = heartbeat(1);
        bad.interval_ms = 0;
        let out = apply_one(
            &store,
            10,
            vec![Mutation::RecordHeartbeat {
                region: "eu".into(),
                heartbeat: bad,
            }],
        );
        assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
        assert!(store.read().unwrap().region("eu").unwrap().is_none());
        assert_eq!(hash(&store), before);
    }

    #[test]
    fn cordon_and_uncordon() {
        let store = Store::in_memory().unwrap();
        apply_one(&store, 1, vec![add_region("eu")]);
        let cordon = Mutation::SetRegionSchedulable {
            name: "eu".into(),
            schedulable: false,
        };
        let out = apply_one(&store, 2, vec![cordon.clone()]);
        let Ok(Outcome::Region(region)) = &out[0] else {
            panic!("{out:?}")
        };
        assert!(!region.schedulable);
        let before = hash(&store);
        apply_one(&store, 3, vec![cordon]);
        assert_eq!(hash(&store), before, "cordoning twice changes nothing");
        apply_one(
            &store,
            4,
            vec![Mutation::SetRegionSchedulable {
                name: "eu".into(),
                schedulable: true,
            }],
        );
        assert!(
            store
                .read()
                .unwrap()
                .region("eu")
                .unwrap()
                .unwrap()
                .schedulable
        );
    }

    #[test]
    fn an_unknown_region_is_not_found_naming_it() {
        let store = Store::in_memory().unwrap();
        let out = apply_one(
            &store,
            1,
            vec![Mutation::SetRegionSchedulable {
                name: "mars".into(),
                schedulable: false,
            }],
        );
        let error = out[0].as_ref().unwrap_err();
        assert_eq!(error.code, ErrorCode::NotFound);
        assert!(error.message.contains("\"mars\""), "{}", error.message);
    }

    #[test]
    fn a_deployment_naming_an_unknown_or_cordoned_region_is_refused_and_writes_nothing() {
        let store = Store::in_memory().unwrap();
        apply_one(
            &store,
            1,
            vec![
                add_region("eu"),
                add_region("us"),
                Mutation::SetRegionSchedulable {
                    name: "us".into(),
                    schedulable: false,
                },
            ],
        );
        let before = hash(&store);
        let last_pk = store.read().unwrap().last_pk();
        let out = apply_one(&store, 2, vec![submit("d1", &["eu", "us", "ap"], 1)]);
        let error = out[0].as_ref().unwrap_err();
        assert_eq!(error.code, ErrorCode::BadRequest);
        assert!(
            error.message.contains("\"us\" is cordoned")
                && error.message.contains("\"ap\" is unknown"),
            "{}",
            error.message
        );
        assert!(!error.message.contains("\"eu\""), "{}", error.message);
        assert_eq!(hash(&store), before, "the refusal wrote nothing");
        let view = store.read().unwrap();
        assert_eq!(view.last_pk(), last_pk);
        assert!(view.deployment("d1").unwrap().is_none());
        drop(view);

        // Uncordoned and added, the same create goes through.
        apply_one(
            &store,
            3,
            vec![
                Mutation::SetRegionSchedulable {
                    name: "us".into(),
                    schedulable: true,
                },
                add_region("ap"),
            ],
        );
        let out = apply_one(&store, 4, vec![submit("d1", &["eu", "us", "ap"], 1)]);
        assert!(
            matches!(out[0], Ok(Outcome::DeploymentCreated { .. })),
            "{out:?}"
        );
    }
}
