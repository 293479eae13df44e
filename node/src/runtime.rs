//! The runtime openraft runs on: a current-thread tokio runtime driven by
//! a thread of its own, so replication, commit and apply never queue
//! behind client streams on the shared workers. Raft RPC streams and
//! connections from members' addresses are served there too.

/// The runtime openraft runs on: one thread of its own, so replication,
/// commit and apply never queue behind client streams on the shared
/// workers.
pub struct RaftRuntime {
    handle: tokio::runtime::Handle,
    /// Ends the thread's `block_on` (and so drops its runtime and tasks).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RaftRuntime {
    /// A current-thread runtime driven by a thread of its own: no work
    /// stealing, so no worker is woken for nothing when a task is queued.
    pub fn start(node_id: u64) -> std::io::Result<RaftRuntime> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("raft-{node_id}"))
            .spawn(move || {
                let _ = runtime.block_on(stopped);
                runtime.shutdown_background();
            })?;
        Ok(RaftRuntime {
            handle,
            stop: Some(stop),
        })
    }

    /// The runtime's handle, to spawn tasks on the Raft thread.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
