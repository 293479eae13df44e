//! Regions: add one, cordon or uncordon it, list them with their agents'
//! health, and refuse early a deployment naming a region that cannot take
//! it. Apply decides (a region may be cordoned between this check and the
//! commit); the check here gives a quick, clear answer without a write.
//!
//! What the list derives — heartbeat age, lag, staleness — is computed
//! here at the answering node's time, so the CLI only formats it.

use storage::{ReadView, mutations};
use wire::model::{Region, UnixMs};
use wire::operator::{HEARTBEAT_STALE_INTERVALS, RegionList, RegionView, validate_region};
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, propose};
use crate::clock::Clock;

/// Registers `name` (idempotent); returns the region as it now is.
pub async fn add(state: &impl Propose, name: String) -> Result<Region, WireError> {
    validate_region(&name)?;
    propose(state, mutations::AddRegion { name }).await
}

/// Cordons (`schedulable = false`) or uncordons `name`; returns the region
/// as it now is. An unknown region is `NotFound`.
pub async fn set_schedulable(
    state: &impl Propose,
    name: String,
    schedulable: bool,
) -> Result<Region, WireError> {
    validate_region(&name)?;
    propose(state, mutations::SetRegionSchedulable { name, schedulable }).await
}

/// Every region with its agent's health as of the clock's time, from one
/// read.
pub fn list(state: &impl ReadState, clock: &dyn Clock) -> Result<RegionList, WireError> {
    let view = state.read().map_err(internal)?;
    let as_of_ms = clock.now_ms();
    let last_pk = view.last_pk();
    let regions = view
        .list_regions()
        .map_err(internal)?
        .into_iter()
        .map(|region| region_view(region, last_pk, as_of_ms))
        .collect();
    Ok(RegionList {
        regions,
        last_pk,
        as_of_ms,
    })
}

/// What `ctrl list regions` shows of one region at `now_ms`, with the
/// cluster at `last_pk`.
pub fn region_view(region: Region, last_pk: u64, now_ms: UnixMs) -> RegionView {
    let (heartbeat_age_ms, lag, stale) = match &region.last_heartbeat {
        None => (None, None, true),
        Some(heartbeat) => {
            let age_ms = now_ms.saturating_sub(heartbeat.at_ms);
            let stale_after_ms = heartbeat
                .interval_ms
                .saturating_mul(HEARTBEAT_STALE_INTERVALS);
            (
                Some(age_ms),
                Some(last_pk.saturating_sub(heartbeat.cursor)),
                age_ms > stale_after_ms,
            )
        }
    };
    RegionView {
        region,
        heartbeat_age_ms,
        lag,
        stale,
    }
}

/// Refuses `regions` unless every one is known and schedulable on `view`;
/// the error names each region refused and why.
pub fn check_schedulable(view: &ReadView, regions: &[String]) -> Result<(), WireError> {
    let mut refused = Vec::new();
    for region in regions {
        let row = view.region(region).map_err(internal)?;
        let Some(reason) = Region::unschedulable(row.as_ref()) else {
            continue;
        };
        let hint = match row {
            None => format!("register it with `ctrl region add {region}`"),
            Some(_) => format!("`ctrl region uncordon {region}` lets deployments in"),
        };
        refused.push(format!("{region:?} is {reason} ({hint})"));
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "the deployment may not be scheduled: region {}",
                refused.join(", region ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use storage::Mutation;
    use wire::model::{Heartbeat, RegionSource};

    use super::*;
    use crate::app::testing::{FixedTimeClock, MemoryNode, NOW_MS};

    fn heartbeat(cursor: u64, interval_ms: u64) -> Mutation {
        Mutation::RecordHeartbeat(mutations::RecordHeartbeat {
            region: "us-east".into(),
            heartbeat: Heartbeat {
                agent_version: "0.1.0".into(),
                cursor,
                interval_ms,
                applied_resources: 1,
                failed_applies: Vec::new(),
                at_ms: 0,
            },
        })
    }

    #[tokio::test]
    async fn add_is_idempotent_and_cordon_is_answered_with_the_region() {
        let node = MemoryNode::new();
        let added = add(&node, "eu-west".into()).await.unwrap();
        assert_eq!(added.registered_by, RegionSource::Operator);
        assert_eq!(add(&node, "eu-west".into()).await.unwrap(), added);
        let cordoned = set_schedulable(&node, "eu-west".into(), false)
            .await
            .unwrap();
        assert!(!cordoned.schedulable);
        let e = set_schedulable(&node, "nowhere".into(), false)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("nowhere"), "{}", e.message);
        let proposals = node.proposals();
        let e = add(&node, "Not A Region".into()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(node.proposals(), proposals, "refused before proposing");
    }

    #[tokio::test]
    async fn the_list_computes_lag_and_staleness_at_the_clocks_time() {
        let node = MemoryNode::with_regions(&["ap", "eu-west"]);
        // Eight change rows (four sentinels per region): the last pk is 8.
        let sentinels = ["ap", "eu-west"]
            .iter()
            .flat_map(|region| {
                (0..4).map(|n| {
                    Mutation::UpsertSentinel(wire::model::Sentinel {
                        id: format!("snt_{n}"),
                        region: region.to_string(),
                        ..wire::golden::fixtures::sentinel()
                    })
                })
            })
            .collect();
        node.propose(sentinels).await.unwrap();
        node.propose(vec![heartbeat(7, 1_000)]).await.unwrap();
        let fresh = list(&node, &FixedTimeClock(NOW_MS + 3_000)).unwrap();
        assert_eq!(fresh.last_pk, 8);
        assert_eq!(fresh.as_of_ms, NOW_MS + 3_000);
        let names: Vec<&str> = fresh
            .regions
            .iter()
            .map(|r| r.region.name.as_str())
            .collect();
        assert_eq!(names, ["ap", "eu-west", "us-east"]);
        let us = &fresh.regions[2];
        assert_eq!(us.region.registered_by, RegionSource::Heartbeat);
        assert_eq!(us.heartbeat_age_ms, Some(3_000));
        assert_eq!(us.lag, Some(1));
        assert!(!us.stale, "exactly 3 intervals old is not stale yet");
        let ap = &fresh.regions[0];
        assert_eq!((ap.heartbeat_age_ms, ap.lag, ap.stale), (None, None, true));

        let late = list(&node, &FixedTimeClock(NOW_MS + 3_001)).unwrap();
        assert!(late.regions[2].stale, "more than 3 intervals old");

        node.propose(vec![heartbeat(8, 1_000)]).await.unwrap();
        let caught_up = list(&node, &FixedTimeClock(NOW_MS)).unwrap();
        assert_eq!(caught_up.regions[2].lag, Some(0));
        assert_eq!(caught_up.regions[2].heartbeat_age_ms, Some(0));
    }

    #[test]
    fn a_clock_behind_the_heartbeat_gives_age_zero_not_an_underflow() {
        let region = Region {
            name: "eu".into(),
            schedulable: true,
            registered_by: RegionSource::Heartbeat,
            created_at_ms: 10,
            last_heartbeat: Some(Heartbeat {
                agent_version: "0.1.0".into(),
                cursor: 9,
                interval_ms: u64::MAX,
                applied_resources: 0,
                failed_applies: Vec::new(),
                at_ms: 100,
            }),
        };
        let view = region_view(region, 5, 50);
        assert_eq!(
            (view.heartbeat_age_ms, view.lag, view.stale),
            (Some(0), Some(0), false)
        );
    }
}
