//! Leader-only background jobs, in one place. A [`LeaderJob`] runs only
//! while this node leads: the supervisor ([`supervise`]) starts every job
//! when the node becomes leader and stops them (drops their futures) when
//! it stops leading, when Raft stops, or when the node shuts down. It
//! wakes on role changes only — Raft's server metrics (state, leader,
//! vote, membership), never per entry.
//!
//! Jobs propose through the application layer's seams like any writer; a
//! proposal that is cut off when leadership ends is cancel-safe (it may
//! still commit). Adding a job is one entry in [`leader_jobs`].
//!
//! - [`compaction`]: change-log compaction on a schedule.
//! - [`workflows`]: the workflow driver (deploys, their deadlines and
//!   schedules).
//! - [`notify`]: webhook deliveries (at least once, retried with backoff).
//! - [`backup`]: scheduled backups, when the config has a `[backup]`
//!   section.

pub mod backup;
pub mod compaction;
pub mod identity;
pub mod notify;
pub mod workflows;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use config::NodeConfig;
use openraft::ServerState;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::replica::NodeState;

/// A job's work for one term of leadership.
type JobFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A job that runs only while this node leads.
pub struct LeaderJob {
    name: &'static str,
    start: Box<dyn Fn() -> JobFuture + Send + Sync>,
}

impl LeaderJob {
    /// A job named `name` (for logs) whose work for one term of leadership
    /// is `start()`: called each time the node becomes leader, dropped
    /// when it stops leading.
    pub fn new<F, Fut>(name: &'static str, start: F) -> LeaderJob
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        LeaderJob {
            name,
            start: Box::new(move || Box::pin(start())),
        }
    }

    /// The job's name, for logs.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The leader jobs of a node of `config`.
pub fn leader_jobs(state: &Arc<NodeState>, config: &NodeConfig) -> Vec<LeaderJob> {
    let compaction = {
        let (state, settings) = (state.clone(), config.compaction.clone());
        LeaderJob::new("compaction", move || {
            compaction::run(state.clone(), state.clock.clone(), settings.clone())
        })
    };
    let workflows = {
        let state = state.clone();
        LeaderJob::new("workflows", move || workflows::run(state.clone()))
    };
    let notify = {
        let (state, settings) = (state.clone(), config.notify.clone());
        LeaderJob::new("notify", move || {
            notify::run(state.clone(), settings.clone())
        })
    };
    let identity = {
        let state = state.clone();
        LeaderJob::new("identity", move || identity::run(state.clone()))
    };
    let mut jobs = vec![compaction, workflows, notify, identity];
    if let Some(settings) = &config.backup {
        let (state, settings) = (state.clone(), settings.clone());
        jobs.push(LeaderJob::new("backup", move || {
            backup::run(state.clone(), settings.clone())
        }));
    }
    jobs
}

/// Runs `jobs` on this node while it leads, as Raft's server metrics say,
/// until `stop`'s sender is dropped or Raft stops.
pub async fn supervise_raft(
    state: Arc<NodeState>,
    jobs: Vec<LeaderJob>,
    stop: watch::Receiver<()>,
) {
    let role = state.raft.server_metrics();
    drop(state);
    supervise(role, |m| m.state == ServerState::Leader, jobs, stop).await;
}

/// Runs `jobs` while `leads` holds for the value of `role`: starts them
/// all when it starts holding, stops them (and waits until their futures
/// are dropped) when it stops, and returns once `stop`'s sender or
/// `role`'s sender is dropped, after stopping them.
pub async fn supervise<T>(
    mut role: watch::Receiver<T>,
    leads: impl Fn(&T) -> bool,
    jobs: Vec<LeaderJob>,
    mut stop: watch::Receiver<()>,
) {
    let mut supervisor = Supervisor::new(jobs);
    loop {
        let leading = leads(&role.borrow_and_update());
        supervisor.follow(leading).await;
        tokio::select! {
            changed = role.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = stop.changed() => break,
            () = supervisor.next_ended() => {}
        }
    }
    supervisor.follow(false).await;
}

/// The jobs and, while the node leads, their running tasks.
struct Supervisor {
    jobs: Vec<LeaderJob>,
    running: Option<JoinSet<&'static str>>,
}

impl Supervisor {
    fn new(jobs: Vec<LeaderJob>) -> Supervisor {
        Supervisor {
            jobs,
            running: None,
        }
    }

    /// Starts every job if `leading` and they are not running; stops them
    /// (returning once their futures are dropped) if not `leading`.
    async fn follow(&mut self, leading: bool) {
        match (leading, self.running.take()) {
            (true, None) => {
                debug!(jobs = self.jobs.len(), "leading: starting the leader jobs");
                let mut set = JoinSet::new();
                for job in &self.jobs {
                    let (name, work) = (job.name, (job.start)());
                    set.spawn(async move {
                        work.await;
                        name
                    });
                }
                self.running = Some(set);
            }
            (false, Some(mut set)) => {
                debug!("not leading: stopping the leader jobs");
                set.shutdown().await;
            }
            (_, running) => self.running = running,
        }
    }

    /// Waits until a running job ends by itself, and logs it; pending
    /// while none runs.
    async fn next_ended(&mut self) {
        let ended = match self.running.as_mut() {
            Some(set) if !set.is_empty() => set.join_next().await,
            _ => None,
        };
        match ended {
            Some(Ok(name)) => debug!(job = name, "a leader job ended"),
            Some(Err(e)) => warn!("a leader job failed: {e}"),
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::*;

    /// What the test job reports: started or stopped, with its start count.
    #[derive(Debug, PartialEq, Eq)]
    enum Event {
        Started(u32),
        Stopped(u32),
    }

    /// Reports `Stopped` when its run's future is dropped.
    struct Guard(u32, mpsc::UnboundedSender<Event>);

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.1.send(Event::Stopped(self.0));
        }
    }

    /// A job that reports its starts and stops and otherwise waits forever,
    /// and the number of times it was started.
    fn recording_job() -> (LeaderJob, mpsc::UnboundedReceiver<Event>, Arc<AtomicU32>) {
        let (events, received) = mpsc::unbounded_channel();
        let starts = Arc::new(AtomicU32::new(0));
        let counted = starts.clone();
        let job = LeaderJob::new("recording", move || {
            let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
            let events = events.clone();
            async move {
                let _ = events.send(Event::Started(n));
                let _guard = Guard(n, events);
                std::future::pending::<()>().await;
            }
        });
        (job, received, starts)
    }

    const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

    async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Option<Event> {
        tokio::time::timeout(EVENT_TIMEOUT, events.recv())
            .await
            .expect("an event in time")
    }

    #[tokio::test]
    async fn jobs_start_once_per_term_and_stop_when_the_node_stops_leading() {
        let (job, mut events, starts) = recording_job();
        let mut supervisor = Supervisor::new(vec![job]);
        supervisor.follow(false).await;
        supervisor.follow(true).await;
        assert_eq!(next(&mut events).await, Some(Event::Started(1)));
        // Another change that keeps the node leading restarts nothing.
        supervisor.follow(true).await;
        assert_eq!(starts.load(Ordering::Relaxed), 1);
        supervisor.follow(false).await;
        assert_eq!(next(&mut events).await, Some(Event::Stopped(1)));
        supervisor.follow(false).await;
        supervisor.follow(true).await;
        assert_eq!(next(&mut events).await, Some(Event::Started(2)));
        assert_eq!(starts.load(Ordering::Relaxed), 2, "started once per term");
    }

    #[tokio::test]
    async fn the_supervisor_follows_the_role_and_stops_the_jobs_on_stop() {
        let (job, mut events, _) = recording_job();
        let (role, role_seen) = watch::channel(false);
        let (stop, stopped) = watch::channel(());
        let supervisor = tokio::spawn(supervise(role_seen, |leads| *leads, vec![job], stopped));
        role.send_replace(true);
        assert_eq!(next(&mut events).await, Some(Event::Started(1)));
        role.send_replace(false);
        assert_eq!(next(&mut events).await, Some(Event::Stopped(1)));
        role.send_replace(true);
        assert_eq!(next(&mut events).await, Some(Event::Started(2)));
        drop(stop);
        assert_eq!(next(&mut events).await, Some(Event::Stopped(2)));
        tokio::time::timeout(EVENT_TIMEOUT, supervisor)
            .await
            .expect("the supervisor returns on stop")
            .unwrap();
        assert_eq!(next(&mut events).await, None, "nothing runs after it");
    }

    #[tokio::test]
    async fn jobs_stop_when_raft_stops() {
        let (job, mut events, _) = recording_job();
        let (role, role_seen) = watch::channel(true);
        let (_stop, stopped) = watch::channel(());
        let supervisor = tokio::spawn(supervise(role_seen, |leads| *leads, vec![job], stopped));
        assert_eq!(next(&mut events).await, Some(Event::Started(1)));
        drop(role);
        assert_eq!(next(&mut events).await, Some(Event::Stopped(1)));
        tokio::time::timeout(EVENT_TIMEOUT, supervisor)
            .await
            .expect("the supervisor returns when Raft's metrics end")
            .unwrap();
    }

    #[tokio::test]
    async fn a_job_that_ends_is_not_restarted_within_the_term() {
        let (events, mut received) = mpsc::unbounded_channel();
        let job = LeaderJob::new("once", move || {
            let events = events.clone();
            async move {
                let _ = events.send(Event::Started(0));
            }
        });
        let mut supervisor = Supervisor::new(vec![job]);
        supervisor.follow(true).await;
        assert_eq!(next(&mut received).await, Some(Event::Started(0)));
        tokio::time::timeout(EVENT_TIMEOUT, supervisor.next_ended())
            .await
            .expect("the job's end is seen");
        supervisor.follow(true).await;
        supervisor.follow(false).await;
        supervisor.follow(true).await;
        assert_eq!(
            next(&mut received).await,
            Some(Event::Started(0)),
            "a new term"
        );
        drop(supervisor);
        assert_eq!(next(&mut received).await, None, "started twice in all");
    }
}
