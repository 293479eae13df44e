//! The watch driver: serves one agent's watch stream from the node's own
//! applied state, following the rules of `wire::session`.
//!
//! A full sync reads every live resource of the region from **one** redb
//! read transaction, in bounded pages, then ends with that snapshot's last
//! pk. After it (or straight away for cursor > 0) the driver streams the
//! region's change rows after the cursor, each as the resource's current
//! state, and then waits on the applied-pk channel: a new apply wakes it at
//! once, no polling. A quiet region gets a progress bookmark now and then.
//!
//! A topology's secret values are opened here, for this agent's stream
//! only (`app::secrets`); a value this node cannot open ends the stream
//! with an error rather than sending the topology without it.
//!
//! A slow consumer is cut off: every event is sent within
//! `limits.slow_consumer_timeout_ms`. Sending waits only while the agent's
//! QUIC flow-control window is full (it stopped reading), so the data a
//! stream holds on the node is bounded by that window, and the wait by the
//! timeout; past it the stream is reset with [`SLOW_CONSUMER_RESET_CODE`]
//! (no final event: the window has no room for one) and its read
//! transaction let go. The agent resumes from its cursor on a new stream.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::info;
use transport::stream::FramedStream;
use wire::agent::{ResourceChange, WatchEvent, WatchRequest};
use wire::session::{WatchServer, WatchStart, plan_watch};
use wire::{ErrorCode, Pk, WireError};

use super::ServeError;
use crate::metrics::WatchGuard;
use crate::replica::NodeState;

/// Most change rows read from one read transaction before the next.
pub const CHANGE_PAGE_ROWS: usize = 1_000;
pub use wire::agent::SLOW_CONSUMER_RESET_CODE;

/// Serves a watch until the agent goes away or an error ends it.
pub async fn serve(
    state: &NodeState,
    stream: &mut FramedStream,
    request: WatchRequest,
) -> Result<(), ServeError> {
    let metrics = &state.metrics.watch_opened(&request.region);
    // An agent of protocol 5 or older cannot decode a route: it is served
    // without them.
    let routes = stream.version() >= wire::hello::ROUTES_SINCE_VERSION;
    let mut server = WatchServer::new();
    let mut applied_pk = state.applied_pk.clone();
    let view = state.store.read()?;
    let epoch = node_epoch(&view);
    let plan = plan_watch(
        request.cursor,
        request.epoch,
        epoch,
        view.floor_pk(),
        view.last_pk(),
    );
    match plan {
        WatchStart::FullSync => {
            metrics.full_sync();
            let to = Sync {
                region: &request.region,
                routes,
            };
            full_sync(state, metrics, stream, &mut server, to, view).await?
        }
        WatchStart::Incremental { after } => server.resume(after)?,
        WatchStart::EpochChanged { epoch } => {
            metrics.resync_required();
            info!(
                region = %request.region,
                cursor = request.cursor,
                agent_epoch = request.epoch,
                epoch,
                "the agent's cursor is of another cluster epoch: it must sync in full"
            );
            send(state, metrics, stream, &server.epoch_changed(epoch)?).await?;
            return Ok(());
        }
        WatchStart::ResyncRequired { floor } => {
            metrics.resync_required();
            send(state, metrics, stream, &server.resync_required(floor)).await?;
            return Ok(());
        }
        WatchStart::WaitForCatchUp { cursor } => {
            drop(view);
            let wait = Duration::from_millis(state.limits.watch_catch_up_wait_ms);
            let caught_up = tokio::time::timeout(wait, applied_pk.wait_for(|pk| *pk >= cursor))
                .await
                .is_ok_and(|woke| woke.is_ok());
            if !caught_up {
                let error = WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "cursor {cursor} is ahead of this node's applied changes ({}); try another node",
                        *applied_pk.borrow()
                    ),
                );
                send(state, metrics, stream, &server.error(error)).await?;
                return Ok(());
            }
            server.resume(cursor)?;
        }
    }
    let to = Sync {
        region: &request.region,
        routes,
    };
    stream_changes(state, metrics, stream, &mut server, to, &mut applied_pk).await
}

/// What a watch streams: a region's resources, routes included or not.
#[derive(Clone, Copy)]
struct Sync<'a> {
    region: &'a str,
    routes: bool,
}

/// The epoch of the state `view` reads (0 before the first leader recorded
/// the cluster's identity).
fn node_epoch(view: &storage::ReadView) -> u64 {
    view.cluster_identity().map_or(0, |identity| identity.epoch)
}

async fn full_sync(
    state: &NodeState,
    metrics: &WatchGuard,
    stream: &mut FramedStream,
    server: &mut WatchServer,
    Sync { region, routes }: Sync<'_>,
    view: storage::ReadView,
) -> Result<(), ServeError> {
    let cursor = view.last_pk();
    let epoch = node_epoch(&view);
    send(state, metrics, stream, &server.sync_start(cursor, epoch)?).await?;
    let page = state.limits.sync_page_resources;
    let mut after = None;
    loop {
        let resources = view.region_resources(region, after.as_ref(), page)?;
        let full_page = resources.len() == page;
        after = resources.last().map(|r| r.key());
        for resource in resources {
            if !routes && matches!(resource, wire::model::Resource::Route(_)) {
                continue;
            }
            let resource = crate::app::secrets::open_resource(state.keyring.as_deref(), resource)
                .map_err(ServeError::Resource)?;
            send(state, metrics, stream, &server.sync_item(resource)?).await?;
        }
        if !full_page {
            break;
        }
    }
    send(state, metrics, stream, &server.sync_end()?).await?;
    Ok(())
}

async fn stream_changes(
    state: &NodeState,
    metrics: &WatchGuard,
    stream: &mut FramedStream,
    server: &mut WatchServer,
    Sync { region, routes }: Sync<'_>,
    applied_pk: &mut watch::Receiver<Pk>,
) -> Result<(), ServeError> {
    let progress_every = Duration::from_millis(state.limits.progress_interval_ms);
    let mut next_progress = Instant::now() + progress_every;
    loop {
        let view = state.store.read()?;
        let cursor = server.cursor();
        if cursor < view.floor_pk() {
            metrics.resync_required();
            send(
                state,
                metrics,
                stream,
                &server.resync_required(view.floor_pk()),
            )
            .await?;
            return Ok(());
        }
        let rows = view.changes_after(region, cursor, CHANGE_PAGE_ROWS)?;
        let full_page = rows.len() == CHANGE_PAGE_ROWS;
        for (pk, row) in rows {
            if !routes && row.resource_type == wire::model::ResourceType::Route {
                continue;
            }
            let change = match view.change_event(&row)? {
                ResourceChange::Apply(resource) => ResourceChange::Apply(
                    crate::app::secrets::open_resource(state.keyring.as_deref(), resource)
                        .map_err(ServeError::Resource)?,
                ),
                delete => delete,
            };
            send(state, metrics, stream, &server.change(pk, change)?).await?;
        }
        if full_page {
            continue;
        }
        let seen = view.last_pk();
        drop(view);
        tokio::select! {
            alive = async { applied_pk.wait_for(|pk| *pk > seen).await.is_ok() } => {
                if !alive {
                    // The state machine is gone: the node is shutting down.
                    return Ok(());
                }
            }
            _ = tokio::time::sleep_until(next_progress) => {
                next_progress = Instant::now() + progress_every;
                if let Some(event) = server.progress(seen) {
                    send(state, metrics, stream, &event).await?;
                }
            }
            _ = stream.closed() => return Ok(()),
        }
    }
}

/// Sends a final error event on a watch stream (within the slow-consumer
/// bound, like every event).
pub async fn refuse(
    state: &NodeState,
    stream: &mut FramedStream,
    error: WireError,
) -> Result<(), ServeError> {
    send_event(state, stream, &WatchEvent::Error(error)).await
}

/// Sends one event, waiting at most `slow_consumer_timeout_ms` for room in
/// the consumer's window. After a timeout the stream is out of step (a
/// frame may be half written): it must be reset, not used.
async fn send(
    state: &NodeState,
    metrics: &WatchGuard,
    stream: &mut FramedStream,
    event: &WatchEvent,
) -> Result<(), ServeError> {
    let sent = send_event(state, stream, event).await;
    match &sent {
        Ok(()) => metrics.event_sent(),
        Err(ServeError::SlowConsumer { .. }) => metrics.slow_consumer_reset(),
        Err(_) => {}
    }
    sent
}

/// [`send`], uncounted.
async fn send_event(
    state: &NodeState,
    stream: &mut FramedStream,
    event: &WatchEvent,
) -> Result<(), ServeError> {
    let timeout_ms = state.limits.slow_consumer_timeout_ms;
    match tokio::time::timeout(Duration::from_millis(timeout_ms), stream.send(event)).await {
        Ok(sent) => Ok(sent?),
        Err(_) => Err(ServeError::SlowConsumer { timeout_ms }),
    }
}
