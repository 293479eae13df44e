//! The config files of a loopback cluster as `ctrl serve` and the `ctrl`
//! command line read them, written as TOML text so that a test can append
//! sections of its own (`[raft]`, `[limits]`, …) to a node's.
//!
//! The in-process harnesses build `config::NodeConfig` values instead;
//! both name the files of a certificate directory the same way (`ca.pem`,
//! `node-ID.pem`, `NAME.pem` and `.key`).

use std::net::SocketAddr;
use std::path::Path;

/// Node `id`'s config: its data directory, address, TLS files from
/// `certs`, and its peers (every other node, with its address).
pub fn node_toml(
    id: u64,
    data_dir: &Path,
    addr: SocketAddr,
    certs: &Path,
    peers: &[(u64, SocketAddr)],
) -> String {
    let mut toml = format!(
        "node_id = {id}\ndata_dir = {data_dir:?}\nlisten_addr = \"{addr}\"\n\n{}",
        tls_toml(certs, &format!("node-{id}"))
    );
    for (peer, addr) in peers.iter().filter(|(peer, _)| *peer != id) {
        toml += &format!("\n[[peers]]\nnode_id = {peer}\naddr = \"{addr}\"\n");
    }
    toml
}

/// An operator config naming `endpoints` (in order), presenting the
/// certificate `name` (`operator`, or an agent's) from `certs`.
pub fn operator_toml(endpoints: &[SocketAddr], certs: &Path, name: &str) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "endpoints = [{}]\n\n{}",
        endpoints.join(", "),
        tls_toml(certs, name)
    )
}

fn tls_toml(certs: &Path, name: &str) -> String {
    format!(
        "[tls]\nca_cert = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n",
        ca = certs.join("ca.pem"),
        cert = certs.join(format!("{name}.pem")),
        key = certs.join(format!("{name}.key")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_names_its_peers_but_not_itself() {
        let a: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let toml = node_toml(1, Path::new("/d"), a, Path::new("/c"), &[(1, a), (2, b)]);
        assert!(toml.contains("node_id = 1\n"), "{toml}");
        assert!(toml.contains("cert = \"/c/node-1.pem\""), "{toml}");
        assert_eq!(toml.matches("[[peers]]").count(), 1, "{toml}");
        assert!(
            toml.contains("node_id = 2\naddr = \"127.0.0.1:7002\""),
            "{toml}"
        );
        let operator = operator_toml(&[a, b], Path::new("/c"), "operator");
        assert!(
            operator.starts_with("endpoints = [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]"),
            "{operator}"
        );
    }
}
