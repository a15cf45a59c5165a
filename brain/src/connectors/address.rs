//! Where a connector URL may point the brain (SSRF). A connector makes the brain open HTTP
//! connections to a URL an API key holder chose, from inside the cluster, so:
//!
//! - **always refused** (`metadata_address`): link-local addresses (169.254.0.0/16, which
//!   holds the cloud metadata service 169.254.169.254, and fe80::/10), AWS's IPv6 metadata
//!   address fd00:ec2::254, and the name `metadata.google.internal`;
//! - **refused unless `BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS`** (`private_address`):
//!   loopback (127.0.0.0/8, ::1, the name `localhost`), private ranges (10.0.0.0/8,
//!   172.16.0.0/12, 192.168.0.0/16, fc00::/7), shared address space (100.64.0.0/10) and
//!   the unspecified addresses (0.0.0.0/8, ::), which reach the local host.
//!
//! IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64) are judged
//! by that address. The URL parser has already normalized other spellings of an IPv4
//! address (`http://2852039166/`, `0xa9.0xfe.…`). The rule applies twice: to the URL when a
//! connector is created ([`check_url`]), and to every address its host name resolves to
//! when a turn connects ([`resolve`]); the connection then goes only to the addresses that
//! were checked, so a name cannot resolve to another address in between.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const METADATA_HOSTS: [&str; 1] = ["metadata.google.internal"];
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// Why an address or host is refused: a class for logs and the connector status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Link-local or a cloud metadata address: never allowed.
    Metadata,
    /// Loopback, private or unspecified, while the operator has not allowed them.
    Private,
}

impl Refused {
    pub fn class(self) -> &'static str {
        match self {
            Self::Metadata => "metadata_address",
            Self::Private => "private_address",
        }
    }

    /// What an API client is told.
    pub fn message(self) -> &'static str {
        match self {
            Self::Metadata => "url must not point at a link-local or cloud metadata address",
            Self::Private => {
                "url must not point at a loopback or private network address on this server \
                 (BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS is off)"
            }
        }
    }
}

/// Judges one address.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), Refused> {
    let private = match ip {
        IpAddr::V4(v4) => match v4_class(v4) {
            Some(Refused::Metadata) => return Err(Refused::Metadata),
            Some(Refused::Private) => true,
            None => false,
        },
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return check_ip(IpAddr::V4(v4), allow_private);
            }
            let first = v6.segments()[0];
            if first & 0xffc0 == 0xfe80 || v6 == AWS_METADATA_V6 {
                return Err(Refused::Metadata);
            }
            v6.is_loopback() || v6.is_unspecified() || first & 0xfe00 == 0xfc00
        }
    };
    if private && !allow_private {
        return Err(Refused::Private);
    }
    Ok(())
}

/// `None` for a public IPv4 address; `Some(Private)` is refused only when not allowed.
fn v4_class(v4: Ipv4Addr) -> Option<Refused> {
    let [a, b, ..] = v4.octets();
    if v4.is_link_local() {
        Some(Refused::Metadata)
    } else if v4.is_loopback() || v4.is_private() || a == 0 || (a == 100 && (64..128).contains(&b))
    {
        Some(Refused::Private)
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-compatible (`::a.b.c.d`) or NAT64 (`64:ff9b::a.b.c.d`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let compatible = s[..6] == [0; 6] && !v6.is_loopback() && !v6.is_unspecified();
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then_some(low)
}

/// Judges a host name before any lookup: the names that are known without DNS.
fn check_name(name: &str, allow_private: bool) -> Result<(), Refused> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if METADATA_HOSTS.contains(&name.as_str()) {
        return Err(Refused::Metadata);
    }
    let local = name == "localhost" || name.ends_with(".localhost");
    if local && !allow_private {
        return Err(Refused::Private);
    }
    Ok(())
}

/// The host of `url` as an address, or `None` for a name. `host_str` writes an IPv6
/// address in brackets.
fn host_ip(url: &reqwest::Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Judges a URL's host without DNS (at create time): an address literal, or a name.
pub fn check_url(url: &reqwest::Url, allow_private: bool) -> Result<(), Refused> {
    match host_ip(url) {
        Some(ip) => check_ip(ip, allow_private),
        None => check_name(url.host_str().unwrap_or_default(), allow_private),
    }
}

/// What a connection to `url` may use: for a host name, the addresses it resolves to,
/// each checked (any refused one refuses the whole name, since a client would try them
/// all); for an address literal, nothing to resolve. The error is a class.
pub async fn resolve(
    url: &reqwest::Url,
    allow_private: bool,
) -> Result<Option<(String, Vec<SocketAddr>)>, &'static str> {
    check_url(url, allow_private).map_err(Refused::class)?;
    if host_ip(url).is_some() {
        return Ok(None);
    }
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|_| "unresolvable")?
        .collect();
    if addresses.is_empty() {
        return Err("unresolvable");
    }
    for address in &addresses {
        check_ip(address.ip(), allow_private).map_err(Refused::class)?;
    }
    Ok(Some((host, addresses)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn metadata_and_link_local_are_always_refused() {
        for s in [
            "169.254.169.254",
            "169.254.0.1",
            "fe80::1",
            "febf::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert_eq!(check_ip(ip(s), true), Err(Refused::Metadata), "{s}");
        }
    }

    #[test]
    fn private_ranges_need_the_operator() {
        for s in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
        ] {
            assert_eq!(check_ip(ip(s), false), Err(Refused::Private), "{s}");
            assert_eq!(check_ip(ip(s), true), Ok(()), "{s}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in [
            "93.184.215.14",
            "172.32.0.1",
            "100.128.0.1",
            "8.8.8.8",
            "2606:4700::1111",
            "fec0::1",
        ] {
            assert_eq!(check_ip(ip(s), false), Ok(()), "{s}");
        }
    }

    #[test]
    fn names() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert_eq!(
            check_url(&url("http://metadata.google.internal./x"), true),
            Err(Refused::Metadata)
        );
        assert_eq!(
            check_url(&url("http://LocalHost:3000/"), false),
            Err(Refused::Private)
        );
        assert_eq!(
            check_url(&url("http://api.localhost/"), false),
            Err(Refused::Private)
        );
        assert_eq!(check_url(&url("http://localhost:3000/"), true), Ok(()));
        assert_eq!(check_url(&url("https://mcp.example.com/"), false), Ok(()));
        assert_eq!(
            check_url(&url("http://[::ffff:a9fe:a9fe]/"), true),
            Err(Refused::Metadata)
        );
        assert_eq!(
            check_url(&url("http://2852039166/"), true),
            Err(Refused::Metadata)
        );
    }
}
