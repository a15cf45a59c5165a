//! Where a connector URL may point the brain (SSRF). A connector makes the brain open HTTP
//! connections to a URL an API key holder chose, from inside the cluster, so:
//!
//! - **always refused** (`metadata_address`), whatever the operator allows: the cloud
//!   metadata services and host endpoints, named one by one (link-local 169.254.0.0/16
//!   and fe80::/10, which hold 169.254.169.254; Alibaba's 100.100.100.200; Oracle's
//!   192.0.0.192; Azure's 168.63.129.16; AWS's fd00:ec2::254; the name
//!   `metadata.google.internal`);
//! - **refused unless `BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS`** (`private_address`):
//!   every address that is not global unicast: loopback (and the name `localhost`),
//!   unspecified, private and shared ranges, and every other special-purpose block of the
//!   IANA registries (benchmarking, documentation, protocol assignments, site-local,
//!   multicast, reserved, broadcast).
//!
//! The rule is an allow-list: an address is public only outside every listed block, so a
//! block left off errs towards refusing. IPv6 forms that carry an IPv4 address
//! (IPv4-mapped, IPv4-translated, IPv4-compatible, NAT64, 6to4, Teredo) are judged by that
//! address too, and are never more public than their own block. The URL parser has
//! already normalized other spellings of an IPv4 address (`http://2852039166/`,
//! `0xa9.0xfe.…`). The rule applies twice: to the URL when a connector is created
//! ([`check_url`]), and to every address its host name resolves to when a turn connects
//! ([`resolve`]); the connection then goes only to the addresses that were checked, so a
//! name cannot resolve to another address in between.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

// The rule itself, without I/O, is shared with the egress proxy (W14).
use domain::address::check_name;
pub use domain::address::{Refused, check_ip};

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

/// The longest URL an API caller may give (a connector, a webhook).
pub const MAX_URL: usize = 2000;

/// An absolute `http(s)` URL with a host and no credentials (secrets do not belong in a
/// URL that the API echoes back), whose host the address rule allows; the problem, for the
/// caller, names the operator's `setting` that allows private networks.
pub fn valid_url(raw: &str, allow_private: bool, setting: &str) -> Result<reqwest::Url, String> {
    let raw = raw.trim();
    if raw.len() > MAX_URL || raw.contains(char::is_whitespace) {
        return Err(format!(
            "url must be at most {MAX_URL} characters, without spaces"
        ));
    }
    let url = reqwest::Url::parse(raw).map_err(|_| "url is not a valid URL".to_owned())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("url must use http or https".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("url must name a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url must not contain credentials".into());
    }
    check_url(&url, allow_private).map_err(|refused| refused.message_naming(setting))?;
    Ok(url)
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

/// A reqwest resolver that refuses a name when any of its addresses is refused, so a
/// connection goes only to judged addresses (as [`resolve`] does for an MCP server). Used
/// by every client whose URLs an API caller chose: connector OAuth, webhook deliveries.
/// An address literal never reaches a resolver: judge it with [`check_url`] as well.
pub struct CheckedResolver {
    pub allow_private_networks: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("address refused: {}", .0.class())]
struct RefusedAddress(Refused);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow_private_networks;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            type BoxError = Box<dyn std::error::Error + Send + Sync>;
            let url = reqwest::Url::parse(&format!("http://{host}/"))
                .map_err(|e| Box::new(e) as BoxError)?;
            check_url(&url, allow).map_err(|r| Box::new(RefusedAddress(r)) as BoxError)?;
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| Box::new(e) as BoxError)?
                .collect();
            for a in &addresses {
                check_ip(a.ip(), allow).map_err(|r| Box::new(RefusedAddress(r)) as BoxError)?;
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The refusal of [`CheckedResolver`] behind a failed request, if that is why it failed.
pub fn refused_in(error: &reqwest::Error) -> Option<Refused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(RefusedAddress(refused)) = current.downcast_ref::<RefusedAddress>() {
            return Some(*refused);
        }
        source = current.source();
    }
    None
}

/// The outbound client of webhooks and channels (P11): no redirects, no proxy, every resolved address judged by the
/// address rule. Channels (P11) call their platforms with it too.
pub fn client(timeout: Duration, allow_private_networks: bool) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(CheckedResolver {
            allow_private_networks,
        })
        .build()
}

/// The class of a failed outbound request, for metrics and the delivery's record.
pub fn request_class(error: &reqwest::Error) -> &'static str {
    if let Some(refused) = refused_in(error) {
        refused.class()
    } else if error.is_timeout() {
        "timeout"
    } else if error.is_connect() {
        "connect"
    } else if error.is_builder() {
        "invalid_request"
    } else {
        "request"
    }
}

/// A failed delivery's wait before attempt `attempt` (from 1): `base` doubled per
/// attempt, at most `max`, less up to a fifth at random; the webhooks' backoff with its own
/// ceiling (a channel's reply waits at most a minute) (a channel's reply waits at most a minute).
pub fn backoff_within(base: Duration, max: Duration, attempt: i32) -> Duration {
    let doubled = base.saturating_mul(1u32 << attempt.clamp(1, 20).saturating_sub(1));
    let capped = doubled.min(max);
    capped.mul_f64(rand::Rng::random_range(&mut rand::rng(), 0.8..=1.0))
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
            // Named metadata services outside link-local, and the metadata address in
            // every IPv6 wrapping.
            "100.100.100.200",
            "192.0.0.192",
            "168.63.129.16",
            "::ffff:0:a9fe:a9fe",
            "::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378:8000:63bf:5601:5601",
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
            // Special-purpose IPv4: reserved, benchmarking, documentation, 6to4 relays.
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.1",
            "203.0.113.1",
            // Multicast, reserved and broadcast.
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6 wrappings of private or public addresses in non-global blocks.
            "::ffff:0:a00:1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1::808:808",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "::808:808",
            "2001::1",
            // Non-global IPv6 blocks: site-local, multicast, discard, SRv6, protocol
            // assignments, documentation.
            "fec0::1",
            "feff::1",
            "ff02::1",
            "ff0e::1",
            "100::1",
            "5f00::1",
            "2001:2::1",
            "2001:db8::1",
            "3fff::1",
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
            "1.1.1.1",
            "192.0.1.1",
            "198.20.0.1",
            "223.255.255.1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2a00:1450::1",
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
