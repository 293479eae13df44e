//! The active prober: every probe interval it opens a TCP connection to
//! each ejected instance (within the connect timeout, a bounded number at
//! once) and puts back in rotation those that accept. Passive ejection
//! (the proxy's failed connections) takes instances out; only this puts
//! them back.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpStream;
use tracing::info;

use crate::routes::Routes;

/// Most probes in flight at once.
const PROBES_IN_FLIGHT_MAX: usize = 64;

/// Probes the ejected instances of `routes` every `interval`, for ever.
pub async fn run(routes: Arc<Routes>, interval: Duration, connect_timeout: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let ejected = routes.ejected();
        if ejected.is_empty() {
            continue;
        }
        let probes = futures::stream::iter(ejected)
            .map(|instance| async move {
                let connected = tokio::time::timeout(connect_timeout, TcpStream::connect(instance))
                    .await
                    .is_ok_and(|r| r.is_ok());
                (instance, connected)
            })
            .buffer_unordered(PROBES_IN_FLIGHT_MAX);
        let mut probes = std::pin::pin!(probes);
        while let Some((instance, connected)) = probes.next().await {
            if connected && let Some(out_ms) = routes.restore(instance) {
                info!(%instance, out_ms, "instance back in rotation: it accepts connections");
            }
        }
    }
}
