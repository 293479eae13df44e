//! Pods' addresses, and what of a Running pod is served on its address:
//! plain data and pure functions, no sockets. The controller's passes
//! decide with them which pods should be served ([`EndpointChange`]s);
//! [`echo`](super::echo) owns the listeners and follows those changes.
//!
//! Two networks ([`PodNetwork`]): `Cluster` gives `10.244.0.0/14`-like
//! addresses nothing listens on (the default); `Loopback` gives every pod
//! its own address in `127.0.0.0/8` and serves each declared TCP
//! `containerPort` with an echo. Loopback addresses come from one counter
//! per process, so simulators sharing a process (the regions of a fleet)
//! never hand out the same address; the counter starts at an offset mixed
//! from the process id, so simulators of concurrent test processes are
//! unlikely to meet (if they do, the later bind fails and is logged). An
//! address is never handed out twice in a process before the counter
//! wraps, after [`LOOPBACK_ADDRESSES`] pods.
//!
//! On Linux every address of `127.0.0.0/8` is routed to the loopback
//! interface; other systems need aliases for them.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Map, Value};

use super::meta;

/// Where pods get their addresses, and whether anything listens there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PodNetwork {
    /// Cluster-like addresses (`10.244.x.y` … `10.255.x.y`), nothing
    /// listening: a pod is only an object.
    #[default]
    Cluster,
    /// A distinct `127.x.y.z` per pod (never `127.0.x.y`, so never
    /// `127.0.0.1`), with an echo on every declared TCP port.
    Loopback,
}

impl FromStr for PodNetwork {
    type Err = String;

    fn from_str(s: &str) -> Result<PodNetwork, String> {
        match s {
            "cluster" => Ok(PodNetwork::Cluster),
            "loopback" => Ok(PodNetwork::Loopback),
            other => Err(format!(
                "unknown pod network {other:?} (cluster or loopback)"
            )),
        }
    }
}

impl fmt::Display for PodNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PodNetwork::Cluster => "cluster",
            PodNetwork::Loopback => "loopback",
        })
    }
}

/// Hosts per `/24` of the loopback pool (`.1` to `.254`).
const HOSTS_PER_24: u32 = 254;

/// Addresses of the loopback pool: `127.1.0.1` to `127.255.255.254`,
/// without the `.0` and `.255` of each `/24`.
pub const LOOPBACK_ADDRESSES: u32 = 255 * 256 * HOSTS_PER_24;

/// The process-wide loopback counter, starting at an offset mixed from
/// the process id.
static LOOPBACK_NEXT: LazyLock<AtomicU32> = LazyLock::new(|| {
    let offset = meta::mix64(u64::from(std::process::id())) % u64::from(LOOPBACK_ADDRESSES);
    // The modulo keeps it below LOOPBACK_ADDRESSES, a u32.
    AtomicU32::new(u32::try_from(offset).unwrap_or(0))
});

/// The `n`th address of the loopback pool (`n` taken modulo its size).
pub fn loopback_address(n: u32) -> Ipv4Addr {
    let n = n % LOOPBACK_ADDRESSES;
    let host = n % HOSTS_PER_24;
    let net = n / HOSTS_PER_24;
    let octet = |x: u32| u8::try_from(x % 256).unwrap_or(0);
    Ipv4Addr::new(127, octet(1 + net / 256), octet(net), octet(1 + host))
}

/// Hands out pod addresses on one network.
#[derive(Debug, Default)]
pub struct Addresses {
    network: PodNetwork,
    /// Addresses handed out on the cluster network.
    cluster_count: u32,
}

impl Addresses {
    /// Addresses on `network`.
    pub fn new(network: PodNetwork) -> Addresses {
        Addresses {
            network,
            cluster_count: 0,
        }
    }

    /// The network addresses come from.
    pub fn network(&self) -> PodNetwork {
        self.network
    }

    /// A fresh address.
    pub fn allocate(&mut self) -> Ipv4Addr {
        match self.network {
            PodNetwork::Loopback => loopback_address(LOOPBACK_NEXT.fetch_add(1, Ordering::Relaxed)),
            PodNetwork::Cluster => loop {
                self.cluster_count = self.cluster_count.wrapping_add(1);
                let n = self.cluster_count;
                let octet = |x: u32| u8::try_from(x & 0xff).unwrap_or(0);
                let (b, c, d) = (244 + (n >> 16) % 12, n >> 8, n);
                if octet(d) != 0 && octet(d) != 255 {
                    break Ipv4Addr::new(10, octet(b), octet(c), octet(d));
                }
            },
        }
    }
}

/// Most ports served for one pod (further declared ports are ignored).
pub const PORTS_PER_POD_MAX: usize = 32;

/// What the echo of a pod names in its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// The first container's image.
    pub image: String,
    /// `metadata.labels` (an object, empty if none).
    pub labels: Map<String, Value>,
}

/// A pod to serve: its address, its declared TCP ports, what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `status.podIP`.
    pub ip: Ipv4Addr,
    /// Declared TCP `containerPort`s of every container, sorted, distinct,
    /// at most [`PORTS_PER_POD_MAX`].
    pub ports: Vec<u16>,
    /// What its echo answers with.
    pub identity: PodIdentity,
}

/// A change to the set of served pods (pods by uid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointChange {
    /// Serve the pod so (it is new, or its endpoint changed).
    Serve {
        /// The pod's uid.
        uid: String,
        /// Its endpoint now.
        endpoint: Endpoint,
    },
    /// Stop serving the pod (deleted, no longer Running, or no port left).
    Stop {
        /// The pod's uid.
        uid: String,
    },
}

/// The endpoint a pod should have: `Some` when it is Running with a
/// loopback address other than `127.0.0.1` and declares at least one TCP
/// `containerPort`.
pub fn endpoint(pod: &Value) -> Option<Endpoint> {
    if pod.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        return None;
    }
    let ip: Ipv4Addr = pod.pointer("/status/podIP")?.as_str()?.parse().ok()?;
    if !ip.is_loopback() || ip == Ipv4Addr::LOCALHOST {
        return None;
    }
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut ports: Vec<u16> = containers
        .iter()
        .filter_map(|c| c.get("ports")?.as_array())
        .flatten()
        // No protocol (or null) is TCP, as the API server defaults it.
        .filter(|p| {
            p.get("protocol")
                .and_then(Value::as_str)
                .is_none_or(|proto| proto == "TCP")
        })
        .filter_map(|p| u16::try_from(p.get("containerPort")?.as_u64()?).ok())
        .filter(|&p| p != 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports.truncate(PORTS_PER_POD_MAX);
    if ports.is_empty() {
        return None;
    }
    let image = containers
        .first()
        .and_then(|c| c.get("image")?.as_str())
        .unwrap_or("");
    let labels = pod
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Some(Endpoint {
        ip,
        ports,
        identity: PodIdentity {
            name: meta::name_of(pod).to_string(),
            namespace: meta::meta_str(pod, "namespace").unwrap_or("").to_string(),
            image: image.to_string(),
            labels,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::json;

    use super::*;

    #[test]
    fn loopback_addresses_avoid_localhost_and_broadcast_octets() {
        assert_eq!(loopback_address(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(loopback_address(253), Ipv4Addr::new(127, 1, 0, 254));
        assert_eq!(loopback_address(254), Ipv4Addr::new(127, 1, 1, 1));
        assert_eq!(
            loopback_address(LOOPBACK_ADDRESSES - 1),
            Ipv4Addr::new(127, 255, 255, 254)
        );
        assert_eq!(loopback_address(LOOPBACK_ADDRESSES), loopback_address(0));
        let mut a = Addresses::new(PodNetwork::Loopback);
        let seen: HashSet<Ipv4Addr> = (0..10_000).map(|_| a.allocate()).collect();
        assert_eq!(seen.len(), 10_000);
        assert!(
            seen.iter()
                .all(|ip| ip.octets()[1] != 0 && ip.is_loopback())
        );
        assert!(seen.iter().all(|ip| !matches!(ip.octets()[3], 0 | 255)));
    }

    #[test]
    fn cluster_addresses_are_distinct() {
        let mut a = Addresses::default();
        let seen: HashSet<Ipv4Addr> = (0..70_000).map(|_| a.allocate()).collect();
        assert_eq!(seen.len(), 70_000);
        assert!(seen.iter().all(|ip| ip.octets()[0] == 10));
    }

    fn pod(phase: &str, ip: &str, ports: Value) -> Value {
        json!({"metadata": {"name": "web-0", "namespace": "apps", "labels": {"app": "web"}},
               "spec": {"containers": [
                   {"name": "app", "image": "app:1", "ports": ports},
                   {"name": "side", "image": "side:1", "ports": [{"containerPort": 9000}]}]},
               "status": {"phase": phase, "podIP": ip}})
    }

    #[test]
    fn a_running_loopback_pod_with_tcp_ports_is_served() {
        let ports = json!([{"containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"},
                           {"containerPort": 8080, "protocol": "TCP"}, {"containerPort": "x"}]);
        let e = endpoint(&pod("Running", "127.3.0.7", ports.clone())).unwrap();
        assert_eq!(e.ip, Ipv4Addr::new(127, 3, 0, 7));
        assert_eq!(e.ports, [8080, 9000]);
        assert_eq!(e.identity.image, "app:1");
        assert_eq!(e.identity.namespace, "apps");
        assert_eq!(e.identity.labels["app"], "web");
        for p in [
            pod("Pending", "127.3.0.7", ports.clone()),
            pod("Running", "127.0.0.1", ports.clone()),
            pod("Running", "10.244.0.7", ports),
        ] {
            assert_eq!(endpoint(&p), None, "{p}");
        }
        let mut portless = pod("Running", "127.3.0.7", json!([]));
        portless["spec"]["containers"][1]["ports"] = json!(null);
        assert_eq!(endpoint(&portless), None);
    }
}
