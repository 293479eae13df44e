//! krane: the per-cluster agent. It watches its region's desired state
//! from ctrl, converges the Kubernetes cluster with server-side apply, keeps
//! its cursor and a last-applied snapshot in a local redb file (a restart
//! resumes without a full sync), and reports the pods it runs back to ctrl.
//!
//! - [`state`]: the local redb file (cursor, full-sync count, snapshot).
//! - [`k8s`]: the client, labels, and guarded apply/delete.
//! - [`controller`]: what each resource becomes ([`controller::deployment`]:
//!   a headless Service and a StatefulSet), behind the [`controller::Reconciler`]
//!   seam.
//! - [`watch`]: the watch loop (a sans-socket stream handler and its
//!   driver), applying concurrently ([`watch::pipeline`]).
//! - [`locks`]: one lock per resource, shared by applies and repairs.
//! - [`drift`]: watches the managed objects and re-applies a deleted or
//!   changed one from the snapshot, also while ctrl is unreachable.
//! - [`status`]: the pod watcher and the status reports.
//! - [`routes`]: ctrl's routes as the sentinels' routes ConfigMaps, with
//!   the ready pod addresses the pod watcher sees.
//! - [`heartbeat`]: the heartbeat sent to ctrl every interval (version,
//!   cursor, applied and failed resources).
//! - [`ctrl`]: the QUIC client of ctrl with endpoint failover.
//! - [`backoff`]: jittered reconnect waits.
//! - [`metrics`]: the metrics and readiness served on `metrics_addr`.
//! - [`run`]: wires them together for `krane run`.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod controller;
pub mod ctrl;
pub mod drift;
pub mod heartbeat;
pub mod k8s;
pub mod locks;
pub mod metrics;
pub mod routes;
pub mod run;
pub mod state;
pub mod status;
pub mod watch;

#[cfg(test)]
mod test_support;
