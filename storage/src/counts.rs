//! Deployments, instances and topologies counted by status, kept in step
//! with the state by apply, in memory only: what the node's metrics show
//! without reading every deployment at each scrape.
//!
//! Apply adds what each write changes to a `CountDelta` (the old value
//! comes back from the table's insert or remove) and, once its
//! transaction commits, folds the delta into the store's [`Counts`]. The
//! lock over them is held across the commit, so a recount (at the first
//! [`crate::Store::counts`] after opening, and after a snapshot import)
//! sees each commit either wholly counted or not at all.

use std::collections::BTreeMap;

use redb::{ReadOnlyTable, ReadableTable};
use wire::model::{Deployment, DeploymentTopology, Instance};

use crate::error::{RedbContext, Result};
use crate::tables::{Bytes, decode, name};

/// How many of each there are, by the status's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Deployments by status (`deploying`, `ready`, ...).
    pub deployments: BTreeMap<&'static str, u64>,
    /// Instances by status (`pending`, `running`, `failed`).
    pub instances: BTreeMap<&'static str, u64>,
    /// Topologies (a deployment in one region) by desired state.
    pub topologies: BTreeMap<&'static str, u64>,
}

/// What one apply transaction changed in the [`Counts`].
#[derive(Debug, Default)]
pub(crate) struct CountDelta {
    deployments: BTreeMap<&'static str, i64>,
    instances: BTreeMap<&'static str, i64>,
    topologies: BTreeMap<&'static str, i64>,
}

impl CountDelta {
    /// A deployment written over `old` (none: created).
    pub(crate) fn deployment(&mut self, old: Option<&Deployment>, new: &Deployment) {
        if let Some(old) = old {
            *self.deployments.entry(old.status.as_str()).or_default() -= 1;
        }
        *self.deployments.entry(new.status.as_str()).or_default() += 1;
    }

    /// A topology written over `old` (none: created).
    pub(crate) fn topology(&mut self, old: Option<&DeploymentTopology>, new: &DeploymentTopology) {
        if let Some(old) = old {
            *self
                .topologies
                .entry(old.desired_state.as_str())
                .or_default() -= 1;
        }
        *self
            .topologies
            .entry(new.desired_state.as_str())
            .or_default() += 1;
    }

    /// An instance written (`new`) over `old`, or removed (`new` none).
    pub(crate) fn instance(&mut self, old: Option<&Instance>, new: Option<&Instance>) {
        if let Some(old) = old {
            *self.instances.entry(old.status.as_str()).or_default() -= 1;
        }
        if let Some(new) = new {
            *self.instances.entry(new.status.as_str()).or_default() += 1;
        }
    }
}

impl Counts {
    /// Folds in a committed transaction's delta.
    pub(crate) fn add(&mut self, delta: &CountDelta) {
        for (counts, changes) in [
            (&mut self.deployments, &delta.deployments),
            (&mut self.instances, &delta.instances),
            (&mut self.topologies, &delta.topologies),
        ] {
            for (&status, &change) in changes {
                let count = counts.entry(status).or_default();
                *count = count.saturating_add_signed(change);
            }
        }
    }

    /// Counts every row of the three tables (one read transaction).
    pub(crate) fn recount(txn: &redb::ReadTransaction) -> Result<Counts> {
        const OP: &str = "count by status";
        let mut counts = Counts::default();
        let deployments = txn
            .open_table(crate::tables::DEPLOYMENTS)
            .ctx_table(OP, name::DEPLOYMENTS)?;
        count(&deployments, name::DEPLOYMENTS, |d: Deployment| {
            *counts.deployments.entry(d.status.as_str()).or_default() += 1;
        })?;
        let instances = txn
            .open_table(crate::tables::INSTANCES)
            .ctx_table(OP, name::INSTANCES)?;
        count(&instances, name::INSTANCES, |i: Instance| {
            *counts.instances.entry(i.status.as_str()).or_default() += 1;
        })?;
        let topologies = txn
            .open_table(crate::tables::DEPLOYMENT_TOPOLOGY)
            .ctx_table(OP, name::DEPLOYMENT_TOPOLOGY)?;
        count(
            &topologies,
            name::DEPLOYMENT_TOPOLOGY,
            |t: DeploymentTopology| {
                *counts
                    .topologies
                    .entry(t.desired_state.as_str())
                    .or_default() += 1;
            },
        )?;
        Ok(counts)
    }
}

/// Decodes every value of `table` into `each`.
fn count<K, T>(
    table: &ReadOnlyTable<K, Bytes>,
    table_name: &'static str,
    mut each: impl FnMut(T),
) -> Result<()>
where
    K: redb::Key + 'static,
    for<'a> K::SelfType<'a>: std::fmt::Debug,
    T: serde::de::DeserializeOwned,
{
    for entry in table.iter().ctx_table("count by status", table_name)? {
        let (key, value) = entry.ctx_table("count by status", table_name)?;
        each(decode(table_name, &key.value(), value.value())?);
    }
    Ok(())
}
