//! The server's connections: counted while open, and
//! [`Simulator::settle_connections`] waits until the server is done with
//! every connection opened before it (what a test that killed a client
//! needs before it counts writes).

use std::time::Duration;

use k8s_sim::{SimConfig, Simulator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);
/// Long enough for the server to serve a request on loopback, short
/// enough for a wait expected to time out.
const SHORT: Duration = Duration::from_millis(300);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("the test finishes in time")
}

/// A kept-alive connection that made one request and read its answer's
/// head.
async fn idle_client(sim: &Simulator) -> TcpStream {
    let mut stream = TcpStream::connect(sim.addr()).await.expect("connect");
    stream
        .write_all(b"GET /version HTTP/1.1\r\nHost: k8s-sim\r\n\r\n")
        .await
        .expect("request sent");
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.expect("answer read");
    assert_eq!(&head, b"HTTP/1.1 200");
    stream
}

#[tokio::test]
async fn settling_waits_until_every_earlier_connection_is_closed() {
    bounded(async {
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        assert_eq!(sim.open_connections(), 0);
        let client = idle_client(&sim).await;
        assert_eq!(sim.open_connections(), 1);
        assert!(
            sim.settle_connections(SHORT).await.is_err(),
            "a client still connected: not settled"
        );
        drop(client);
        sim.settle_connections(WAIT)
            .await
            .expect("settled once the client closed");
        assert_eq!(sim.open_connections(), 0);
        sim.shutdown().await;
    })
    .await;
}
