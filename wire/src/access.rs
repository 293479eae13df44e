//! Who may call what, free of I/O: the operator roles, the environment
//! scope a certificate grants, the access each operator request needs
//! ([`OperatorRequest::access`], one exhaustive match, so a new request
//! kind cannot be added without saying who may call it), and the one
//! check ([`Grant::check`]) ctrl's operator handler runs before any
//! request is answered.
//!
//! - `viewer`: every read.
//! - `deployer`: a viewer, and the deployment operations (deploy, stop,
//!   start, archive, cancel, rollback, update) inside its environment
//!   scope.
//! - `admin`: everything (regions, sentinels, rollouts, policies,
//!   notifications, cluster membership, backups).
//!
//! A scope is a list of patterns, each an environment id in which `*`
//! stands for any run of characters (`staging-*`); an empty list is
//! every environment.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, WireError};
use crate::operator::OperatorRequest;

/// Most patterns of one scope.
pub const SCOPE_PATTERNS_MAX: usize = 16;
/// Longest pattern, in bytes (an environment id's bound).
pub const SCOPE_PATTERN_BYTES_MAX: usize = 63;
pub use crate::operator_name::{OPERATOR_NAME_BYTES_MAX, validate_name};
/// The name of an operator certificate issued before names existed
/// (`ctrl://operator`): an admin.
pub const UNNAMED_OPERATOR: &str = "operator";

/// What an operator may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Every read.
    Viewer,
    /// Reads, and the deployment operations inside its scope.
    Deployer,
    /// Everything.
    Admin,
}

impl Role {
    /// Its name (`viewer`, `deployer`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Deployer => "deployer",
            Role::Admin => "admin",
        }
    }

    /// The role named `name`; an error names the roles there are.
    pub fn parse(name: &str) -> Result<Role, String> {
        match name {
            "viewer" => Ok(Role::Viewer),
            "deployer" => Ok(Role::Deployer),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?}: expected viewer, deployer or admin"
            )),
        }
    }
}

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access<'a> {
    /// A read: any operator.
    Read,
    /// A deployment operation in this environment: a deployer whose
    /// scope holds it, or an admin.
    Environment(&'a str),
    /// A deployment operation on this deployment: as `Environment`, for
    /// the deployment's environment (which the node looks up).
    Deployment(&'a str),
    /// An admin.
    Admin,
}

impl OperatorRequest {
    /// What calling this request needs. Every kind is named here (no
    /// wildcard arm): a new kind is refused by the compiler until someone
    /// says who may call it.
    pub fn access(&self) -> Access<'_> {
        use OperatorRequest as R;
        match self {
            R::CreateDeployment(r) => Access::Environment(&r.environment_id),
            R::Rollback(r) => Access::Environment(&r.environment_id),
            R::SetDesiredState(r) => Access::Deployment(&r.id),
            R::CancelDeployment(r) => Access::Deployment(&r.id),
            R::UpdateDeployment(r) => Access::Deployment(&r.id),
            R::GetDeployment(_)
            | R::ListDeployments(_)
            | R::NodeStatus(_)
            | R::LogStatus(_)
            | R::StateHash(_)
            | R::GetSentinel(_)
            | R::WaitDeployment(_)
            | R::ListRegions(_)
            | R::GetEnvironment(_)
            | R::History(_)
            | R::NodeDiagnostics(_)
            | R::ListPolicies(_)
            | R::ListNotifyEndpoints(_)
            | R::ListDeliveries(_)
            | R::ListSentinels(_)
            | R::PlanRollout(_)
            | R::RolloutStatus(_)
            | R::RolloutHistory(_)
            | R::NodeVersion(_)
            | R::DescribeEnvironment(_)
            | R::ListEnvironments(_)
            | R::WaitSentinel(_)
            | R::WaitRollout(_)
            | R::ListRevocations(_) => Access::Read,
            R::InitCluster(_)
            | R::AddNode(_)
            | R::RemoveNode(_)
            | R::ApplySentinel(_)
            | R::StopSentinel(_)
            | R::ApplyPolicy(_)
            | R::DeletePolicy(_)
            | R::AddRegion(_)
            | R::SetRegionSchedulable(_)
            | R::AddNotifyEndpoint(_)
            | R::RemoveNotifyEndpoint(_)
            | R::ReplayDelivery(_)
            | R::StartRollout(_)
            | R::ControlRollout(_)
            // A backup holds every secret, sealed, and the whole state.
            | R::Backup(_)
            | R::RevokeCertificate(_) => Access::Admin,
        }
    }
}

/// Whether `environment` matches `pattern` (`*` is any run of
/// characters, everything else itself).
pub fn pattern_matches(pattern: &str, environment: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = environment.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole id.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Checks a pattern: 1..=[`SCOPE_PATTERN_BYTES_MAX`] bytes of lowercase
/// letters, digits, `-`, `_`, `.` and `*`.
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() || pattern.len() > SCOPE_PATTERN_BYTES_MAX {
        return Err(format!(
            "environment pattern {pattern:?} must be 1 to {SCOPE_PATTERN_BYTES_MAX} bytes"
        ));
    }
    let ok = pattern
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.*".contains(&b));
    if !ok {
        return Err(format!(
            "environment pattern {pattern:?} may hold only lowercase letters, digits, '-', '_', '.' and '*'"
        ));
    }
    Ok(())
}

/// What an operator certificate grants: who, in which role, where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The person (or automation) it was issued to.
    pub name: String,
    /// What they may do.
    pub role: Role,
    /// Where a deployer may do it (patterns; empty: everywhere).
    pub environments: Vec<String>,
}

impl Grant {
    /// The grant of a certificate issued before names and roles existed:
    /// an admin named [`UNNAMED_OPERATOR`].
    pub fn unnamed() -> Grant {
        Grant {
            name: UNNAMED_OPERATOR.to_string(),
            role: Role::Admin,
            environments: Vec::new(),
        }
    }

    /// Whether the scope holds `environment`.
    pub fn covers(&self, environment: &str) -> bool {
        self.environments.is_empty()
            || self
                .environments
                .iter()
                .any(|p| pattern_matches(p, environment))
    }

    /// Allows `request` needing `access`, or refuses it with a
    /// `PermissionDenied` naming the operator, the role, the request
    /// and (for a deployment operation) the environment. `environment`
    /// is the environment an [`Access::Deployment`] resolved to (`None`
    /// for the others, or when the deployment does not exist: then the
    /// request is let through to answer `NotFound` when the operator may
    /// deploy somewhere).
    pub fn check(
        &self,
        request: &str,
        access: Access<'_>,
        environment: Option<&str>,
    ) -> Result<(), WireError> {
        let denied = |what: String| {
            Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "operator {} ({}) may not {request}{what}",
                    self.name,
                    self.role.as_str()
                ),
            ))
        };
        let environment = match access {
            Access::Read => return Ok(()),
            Access::Admin if self.role == Role::Admin => return Ok(()),
            Access::Admin => return denied(": it needs the admin role".to_string()),
            Access::Environment(environment) => Some(environment),
            Access::Deployment(_) => environment,
        };
        match self.role {
            Role::Admin => Ok(()),
            Role::Viewer => denied(match environment {
                Some(e) => format!(" in environment {e}: a viewer only reads"),
                None => ": a viewer only reads".to_string(),
            }),
            Role::Deployer => match environment {
                Some(e) if !self.covers(e) => denied(format!(
                    " in environment {e}: outside its scope {}",
                    self.environments.join(",")
                )),
                _ => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_by_star_and_otherwise_exactly() {
        let cases = [
            ("prod", "prod", true),
            ("prod", "prod-eu", false),
            ("prod", "pro", false),
            ("staging-*", "staging-eu", true),
            ("staging-*", "staging-", true),
            ("staging-*", "staging", false),
            ("*", "anything", true),
            ("*-eu", "prod-eu", true),
            ("*-eu", "prod-us", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
        ];
        for (pattern, environment, want) in cases {
            assert_eq!(
                pattern_matches(pattern, environment),
                want,
                "{pattern} against {environment}"
            );
        }
    }

    #[test]
    fn names_roles_and_patterns_are_checked_naming_what_is_wrong() {
        assert!(validate_name("alice").is_ok());
        assert!(validate_name("ci.bot-2").is_ok());
        for bad in ["", "Alice", "-x", "a b", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_pattern("staging-*").is_ok());
        for bad in ["", "Prod", "a,b", "a/b", &"a".repeat(64)] {
            assert!(validate_pattern(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Role::parse("deployer"), Ok(Role::Deployer));
        let e = Role::parse("root").unwrap_err();
        assert!(
            e.contains("root") && e.contains("viewer, deployer or admin"),
            "{e}"
        );
    }

    #[test]
    fn a_refusal_names_the_operator_the_role_the_request_and_the_environment() {
        let alice = Grant {
            name: "alice".into(),
            role: Role::Deployer,
            environments: vec!["staging-*".into()],
        };
        assert!(
            alice
                .check("create_deployment", Access::Environment("staging-eu"), None)
                .is_ok()
        );
        let e = alice
            .check("create_deployment", Access::Environment("prod"), None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert_eq!(
            e.message,
            "operator alice (deployer) may not create_deployment in environment prod: outside its scope staging-*"
        );
        let e = alice.check("add_region", Access::Admin, None).unwrap_err();
        assert_eq!(
            e.message,
            "operator alice (deployer) may not add_region: it needs the admin role"
        );
        // A deployment that does not exist: let through to its NotFound.
        assert!(
            alice
                .check("cancel_deployment", Access::Deployment("dep_x"), None)
                .is_ok()
        );
        let bob = Grant {
            name: "bob".into(),
            role: Role::Viewer,
            environments: Vec::new(),
        };
        let e = bob
            .check(
                "set_desired_state",
                Access::Deployment("dep_x"),
                Some("prod"),
            )
            .unwrap_err();
        assert_eq!(
            e.message,
            "operator bob (viewer) may not set_desired_state in environment prod: a viewer only reads"
        );
        assert!(bob.check("history", Access::Read, None).is_ok());
        assert!(
            Grant::unnamed()
                .check("backup", Access::Admin, None)
                .is_ok()
        );
    }
}
