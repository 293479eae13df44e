//! Routes: which deployments take an environment's traffic in a region,
//! found by key (an environment's route id in a region is derived,
//! [`wire::rules::deploy::route_id`]).

use wire::model::Route;
use wire::rules::deploy::route_id;

use super::ReadView;
use crate::error::Result;
use crate::tables::{load, name};

impl ReadView {
    /// The route `id` of `region`, if it exists.
    pub fn route(&self, id: &str, region: &str) -> Result<Option<Route>> {
        load(&self.routes, name::ROUTES, (region, id))
    }

    /// The route of `environment_id` in `region`, if it has one.
    pub fn environment_route(&self, environment_id: &str, region: &str) -> Result<Option<Route>> {
        self.route(&route_id(environment_id, region), region)
    }
}
