//! Deployments and what hangs off them: their environments, the open
//! ones the deploy workflow reads, the journal of their transitions, their
//! reported instances and their per-region topologies.

use std::ops::Bound;

use redb::ReadableTable;
use wire::model::{Deployment, DeploymentTopology, Environment, Instance, JournalEntry};

use super::{OP, ReadView};
use crate::error::{RedbContext, Result, StorageError};
use crate::tables::{decode, load, name};

impl ReadView {
    /// The deployment `id`, if it exists.
    pub fn deployment(&self, id: &str) -> Result<Option<Deployment>> {
        load(&self.deployments, name::DEPLOYMENTS, id)
    }

    /// Deployments ordered by id, starting after `after`, at most `limit`.
    pub fn list_deployments(&self, after: Option<&str>, limit: usize) -> Result<Vec<Deployment>> {
        let start = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let range = self
            .deployments
            .range::<&str>((start, Bound::Unbounded))
            .ctx_table(OP, name::DEPLOYMENTS)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::DEPLOYMENTS)?;
            out.push(decode(name::DEPLOYMENTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The sequence number of the newest journal entry (0: none yet).
    pub fn journal_seq(&self) -> u64 {
        self.journal_seq
    }

    /// The environment `id`, if anything was ever deployed to it.
    pub fn environment(&self, id: &str) -> Result<Option<Environment>> {
        load(&self.environments, name::ENVIRONMENTS, id)
    }

    /// Environments ordered by id, starting after `after`, at most `limit`.
    pub fn list_environments(&self, after: Option<&str>, limit: usize) -> Result<Vec<Environment>> {
        let start = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        let range = self
            .environments
            .range::<&str>((start, Bound::Unbounded))
            .ctx_table(OP, name::ENVIRONMENTS)?;
        for entry in range.take(limit) {
            let (key, value) = entry.ctx_table(OP, name::ENVIRONMENTS)?;
            out.push(decode(name::ENVIRONMENTS, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The deployments whose deploy workflow is open, by id, at most
    /// `limit` (in flight, waiting for a scheduled change, or for their
    /// instances to go).
    pub fn open_deployments(&self, limit: usize) -> Result<Vec<Deployment>> {
        let mut out = Vec::new();
        let range = self
            .open_deployments
            .iter()
            .ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::OPEN_DEPLOYMENTS)?;
            let id = key.value();
            let deployment = self.deployment(id)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::OPEN_DEPLOYMENTS,
                    &id,
                    "an open deployment that does not exist",
                )
            })?;
            out.push(deployment);
        }
        Ok(out)
    }

    /// The open deployments of `environment_id`, by id, at most `limit`:
    /// read by key, whatever other environments hold.
    pub fn open_environment_deployments(
        &self,
        environment_id: &str,
        limit: usize,
    ) -> Result<Vec<Deployment>> {
        let mut out = Vec::new();
        let range = self
            .open_deployments_by_environment
            .range::<(&str, &str)>((environment_id, "")..)
            .ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
        for entry in range.take(limit) {
            let (key, _) = entry.ctx_table(OP, name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT)?;
            let (environment, id) = key.value();
            if environment != environment_id {
                break;
            }
            let deployment = self.deployment(id)?.ok_or_else(|| {
                StorageError::corrupt(
                    name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT,
                    &(environment, id),
                    "an open deployment that does not exist",
                )
            })?;
            out.push(deployment);
        }
        Ok(out)
    }

    /// Journal entries after sequence number `after`, oldest first, that
    /// `keep` accepts, at most `limit`; scans at most `scan_max` entries
    /// (a filter that matches little cannot make one read unbounded).
    pub fn journal(
        &self,
        after: u64,
        limit: usize,
        scan_max: usize,
        keep: impl Fn(&JournalEntry) -> bool,
    ) -> Result<Vec<JournalEntry>> {
        let mut out = Vec::new();
        let range = self
            .journal
            .range(after.saturating_add(1)..)
            .ctx_table(OP, name::JOURNAL)?;
        for entry in range.take(scan_max) {
            let (key, value) = entry.ctx_table(OP, name::JOURNAL)?;
            let row: JournalEntry = decode(name::JOURNAL, &key.value(), value.value())?;
            if keep(&row) {
                out.push(row);
                if out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every reported instance of a deployment, by region then pod name.
    pub fn instances(&self, deployment_id: &str) -> Result<Vec<Instance>> {
        let mut out = Vec::new();
        let range = self
            .instances
            .range((deployment_id, "", "")..)
            .ctx_table(OP, name::INSTANCES)?;
        for entry in range {
            let (key, value) = entry.ctx_table(OP, name::INSTANCES)?;
            if key.value().0 != deployment_id {
                break;
            }
            out.push(decode(name::INSTANCES, &key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The topology of a deployment in a region, if it exists.
    pub fn topology(
        &self,
        deployment_id: &str,
        region: &str,
    ) -> Result<Option<DeploymentTopology>> {
        load(
            &self.topology,
            name::DEPLOYMENT_TOPOLOGY,
            (region, deployment_id),
        )
    }
}
