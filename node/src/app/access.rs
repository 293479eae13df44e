//! The one authorization of operator requests, run by the operator
//! handler before any request is answered: what the request needs
//! ([`wire::access::Access`]) against what the caller's certificate
//! grants ([`wire::access::Grant`]). A deployment operation named by a
//! deployment id is judged by that deployment's environment, read here;
//! a scoped deployer naming a deployment this node does not know is
//! answered `NotFound` (it cannot be told to be in scope). A refusal is
//! `PermissionDenied` naming the operator, the role, the request and the
//! environment, and nothing is written.

use wire::access::{Access, Grant, Role};
use wire::operator::OperatorRequest;
use wire::{ErrorCode, WireError};

use super::{ReadState, internal};

/// Allows `request` for `grant`, or refuses it.
pub fn check(
    state: &impl ReadState,
    grant: &Grant,
    request: &OperatorRequest,
) -> Result<(), WireError> {
    let access = request.access();
    let environment = match access {
        Access::Deployment(id) if grant.role != Role::Admin => {
            let view = state.read().map_err(internal)?;
            match view.deployment(id).map_err(internal)? {
                Some(deployment) => Some(deployment.environment_id),
                None if grant.role == Role::Deployer && !grant.environments.is_empty() => {
                    return Err(WireError::new(
                        ErrorCode::NotFound,
                        format!("no deployment {id:?}"),
                    ));
                }
                None => None,
            }
        }
        _ => None,
    };
    grant.check(request.name(), access, environment.as_deref())
}

#[cfg(test)]
mod tests;
