//! [`Endpoint`]: a ctrl node address as an agent config lists it,
//! `host:port` where the host is an IP address or a DNS name.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::validate::{DNS_NAME_BYTES_MAX, connectable_problem, is_dns_name};

/// A ctrl node address: `10.0.0.11:7400`, `[fd00::11]:7400` or
/// `ctrl-0.ctrl.svc:7400`. Written and read as that string.
///
/// The host is kept as written (DNS names lowercased, IP addresses in
/// canonical form), so a name is resolved again on every connect; use
/// [`Endpoint::resolve`] (blocking) or pass its `to_string()` to an
/// async resolver such as `tokio::net::lookup_host`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
}

/// Why a string is not an [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint {input:?}: {reason}")]
pub struct EndpointError {
    /// The text that was parsed.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Endpoint {
    /// The host: an IP address (IPv6 without brackets) or a lowercase DNS
    /// name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The UDP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address, when the host is an IP address.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let ip: IpAddr = self.host.parse().ok()?;
        Some(SocketAddr::new(ip, self.port))
    }

    /// Every address the host resolves to (a DNS lookup unless the host is
    /// an IP address). Blocks; call it off async executors.
    pub fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        if let Some(addr) = self.socket_addr() {
            return Ok(vec![addr]);
        }
        Ok((self.host.as_str(), self.port).to_socket_addrs()?.collect())
    }
}

impl From<SocketAddr> for Endpoint {
    /// Any socket address, even one nobody can connect to (`0.0.0.0`, port
    /// 0); `AgentConfig::validate` refuses those.
    fn from(addr: SocketAddr) -> Endpoint {
        Endpoint {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(input: &str) -> Result<Endpoint, EndpointError> {
        let fail = |reason: &str| EndpointError {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let endpoint = if let Ok(addr) = input.parse::<SocketAddr>() {
            Endpoint::from(addr)
        } else {
            let (host, port) = input
                .rsplit_once(':')
                .ok_or_else(|| fail("expected host:port"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| fail("the port must be a number from 1 to 65535"))?;
            let host = if let Some(inner) = host.strip_prefix('[') {
                let inner = inner
                    .strip_suffix(']')
                    .ok_or_else(|| fail("an IPv6 address needs closing ']'"))?;
                inner
                    .parse::<Ipv6Addr>()
                    .map_err(|_| fail("not an IPv6 address between '[' and ']'"))?
                    .to_string()
            } else if host.contains(':') {
                return Err(fail("write an IPv6 address in brackets: [addr]:port"));
            } else if is_dns_name(host) {
                host.to_ascii_lowercase()
            } else {
                return Err(fail(&format!(
                    "the host must be an IP address or a DNS name (letters, digits, \
                     '-' and '.', at most {DNS_NAME_BYTES_MAX} bytes)"
                )));
            };
            Endpoint { host, port }
        };
        match endpoint.problem() {
            None => Ok(endpoint),
            Some(problem) => Err(fail(problem)),
        }
    }
}

impl Endpoint {
    /// Why nobody can connect to this endpoint, if so.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        match self.socket_addr() {
            Some(addr) => connectable_problem(addr),
            None if self.port == 0 => Some("must have a port other than 0"),
            None => None,
        }
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    /// Parses in the string visitor, so a toml error points at the string
    /// itself (`endpoints[1]`), not at the whole list.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Endpoint, D::Error> {
        deserializer.deserialize_str(EndpointVisitor)
    }
}

struct EndpointVisitor;

impl Visitor<'_> for EndpointVisitor {
    type Value = Endpoint;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a \"host:port\" string")
    }

    fn visit_str<E: de::Error>(self, input: &str) -> Result<Endpoint, E> {
        input.parse().map_err(E::custom)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays() {
        for (input, host, port, shown) in [
            ("10.0.0.11:7400", "10.0.0.11", 7400, "10.0.0.11:7400"),
            ("[fd00::11]:7400", "fd00::11", 7400, "[fd00::11]:7400"),
            ("[FD00:0::11]:7400", "fd00::11", 7400, "[fd00::11]:7400"),
            (
                "ctrl-0.ctrl.svc:7400",
                "ctrl-0.ctrl.svc",
                7400,
                "ctrl-0.ctrl.svc:7400",
            ),
            (
                "Ctrl.Example.COM:1",
                "ctrl.example.com",
                1,
                "ctrl.example.com:1",
            ),
            ("localhost:7400", "localhost", 7400, "localhost:7400"),
        ] {
            let endpoint: Endpoint = input.parse().unwrap();
            assert_eq!(endpoint.host(), host, "{input}");
            assert_eq!(endpoint.port(), port, "{input}");
            assert_eq!(endpoint.to_string(), shown, "{input}");
            assert_eq!(shown.parse::<Endpoint>().unwrap(), endpoint);
        }
    }

    #[test]
    fn serde_as_a_string() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Doc {
            endpoints: Vec<Endpoint>,
        }
        let doc: Doc = toml::from_str("endpoints = [\"[::1]:1\", \"a.b:2\"]").unwrap();
        assert_eq!(doc.endpoints[0].to_string(), "[::1]:1");
        let text = toml::to_string(&doc).unwrap();
        assert_eq!(text, "endpoints = [\"[::1]:1\", \"a.b:2\"]\n");
        assert!(toml::from_str::<Doc>("endpoints = [3]").is_err());
    }

    #[test]
    fn ip_endpoints_have_a_socket_addr() {
        let endpoint: Endpoint = "[::1]:7400".parse().unwrap();
        let addr: SocketAddr = "[::1]:7400".parse().unwrap();
        assert_eq!(endpoint.socket_addr(), Some(addr));
        assert_eq!(endpoint.resolve().unwrap(), vec![addr]);
        let named: Endpoint = "ctrl.local:7400".parse().unwrap();
        assert_eq!(named.socket_addr(), None);
    }

    #[test]
    fn rejects_bad_endpoints() {
        for input in [
            "",
            "host",
            ":7400",
            "host:",
            "host:0",
            "host:65536",
            "host:-1",
            "0.0.0.0:7400",
            "10.0.0.1:0",
            "[::]:7400",
            "::1:7400",
            "[::1:7400",
            "[nope]:7400",
            "bad host:7400",
            "a..b:7400",
            "ctrl_0:7400",
            " 10.0.0.1:7400",
        ] {
            let error = input.parse::<Endpoint>().unwrap_err();
            assert!(
                error.to_string().starts_with("invalid endpoint"),
                "{input}: {error}"
            );
        }
    }
}
