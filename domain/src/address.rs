//! The address rule every outbound connection obeys (SSRF), without I/O: which IP
//! addresses and host names are refused. The brain's connectors, webhooks and OAuth
//! (`engine::address`, which adds URLs and DNS) and the egress proxy of a worker's
//! commands (`egress-proxy`, W14) judge with the same rule:
//!
//! - **always refused** (`metadata_address`), whatever the operator allows: the cloud
//!   metadata services and host endpoints, named one by one (link-local 169.254.0.0/16
//!   and fe80::/10, which hold 169.254.169.254; Alibaba's 100.100.100.200; Oracle's
//!   192.0.0.192; Azure's 168.63.129.16; AWS's fd00:ec2::254; the name
//!   `metadata.google.internal`);
//! - **refused unless the operator allows private networks** (`private_address`): every
//!   address that is not global unicast: loopback (and the name `localhost`),
//!   unspecified, private and shared ranges, and every other special-purpose block of the
//!   IANA registries (benchmarking, documentation, protocol assignments, site-local,
//!   multicast, reserved, broadcast).
//!
//! The rule is an allow-list: an address is public only outside every listed block, so a
//! block left off errs towards refusing. IPv6 forms that carry an IPv4 address
//! (IPv4-mapped, IPv4-translated, IPv4-compatible, NAT64, 6to4, Teredo) are judged by that
//! address too, and are never more public than their own block.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const METADATA_HOSTS: [&str; 1] = ["metadata.google.internal"];

/// Metadata services and host endpoints outside link-local, which the operator's
/// private-networks setting must not open (Azure's is not even private).
const METADATA_V4: [Ipv4Addr; 3] = [
    // Alibaba Cloud's metadata service, inside the shared address space.
    Ipv4Addr::new(100, 100, 100, 200),
    // Oracle Cloud's metadata service.
    Ipv4Addr::new(192, 0, 0, 192),
    // Azure's WireServer: a public address that answers only the VM's own host.
    Ipv4Addr::new(168, 63, 129, 16),
];
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// The IPv4 blocks that are not global unicast, other than link-local: (network, prefix
/// length). IANA's special-purpose blocks (192.0.0.0/24 holds two global anycast
/// services, but nothing a connector would be served from; the deprecated 6to4 relay
/// anycast 192.88.99.0/24), then multicast, the reserved 240/4 and broadcast as one /3.
const NOT_GLOBAL_V4: [(Ipv4Addr, u8); 13] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 0, 2, 0), 24),
    (Ipv4Addr::new(192, 88, 99, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(198, 51, 100, 0), 24),
    (Ipv4Addr::new(203, 0, 113, 0), 24),
    (Ipv4Addr::new(224, 0, 0, 0), 3),
];

/// The blocks inside 2000::/3 that are not global: IETF protocol assignments (Teredo
/// included) and the two documentation blocks.
const NOT_GLOBAL_V6: [(Ipv6Addr, u8); 3] = [
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23),
    (Ipv6Addr::new(0x2001, 0x0db8, 0, 0, 0, 0, 0, 0), 32),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20),
];

/// Why an address or host is refused: a class for logs and the connector status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    /// Not global unicast (loopback, private, special-purpose), while the operator has
    /// not allowed private networks.
    Private,
    /// Link-local or a cloud metadata address: never allowed.
    Metadata,
}

impl Refused {
    pub fn class(self) -> &'static str {
        match self {
            Self::Metadata => "metadata_address",
            Self::Private => "private_address",
        }
    }

    /// What an API client is told, naming the operator's `setting` that would allow
    /// private networks.
    pub fn message_naming(self, setting: &str) -> String {
        match self {
            Self::Metadata => {
                "url must not point at a link-local or cloud metadata address".to_owned()
            }
            Self::Private => format!(
                "url must not point at a loopback, private or other non-public address on \
                 this server ({setting} is off)"
            ),
        }
    }
}

/// Judges one address.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), Refused> {
    let class = match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    };
    match class {
        Some(Refused::Private) if allow_private => Ok(()),
        Some(refused) => Err(refused),
        None => Ok(()),
    }
}

/// `None` for a global unicast IPv4 address; `Some(Private)` is refused only when not
/// allowed.
fn v4_class(v4: Ipv4Addr) -> Option<Refused> {
    if v4.is_link_local() || METADATA_V4.contains(&v4) {
        Some(Refused::Metadata)
    } else if NOT_GLOBAL_V4
        .iter()
        .any(|&(net, len)| u32::from(v4) >> (32 - len) == u32::from(net) >> (32 - len))
    {
        Some(Refused::Private)
    } else {
        None
    }
}

/// As [`v4_class`]. Outside 2000::/3 nothing is global unicast (loopback, unspecified,
/// unique local, site-local, link-local, multicast, the discard and SRv6 blocks).
fn v6_class(v6: Ipv6Addr) -> Option<Refused> {
    if v6.segments()[0] & 0xffc0 == 0xfe80 || v6 == AWS_METADATA_V6 {
        return Some(Refused::Metadata);
    }
    if let Some((v4, global)) = embedded_v4(v6) {
        // The embedded address decides, but a non-global wrapper stays at least private.
        return v4_class(v4).max((!global).then_some(Refused::Private));
    }
    let bits = u128::from(v6);
    let within = |net: Ipv6Addr, len: u8| bits >> (128 - len) == u128::from(net) >> (128 - len);
    let global = within(Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3)
        && !NOT_GLOBAL_V6.iter().any(|&(net, len)| within(net, len));
    (!global).then_some(Refused::Private)
}

/// The IPv4 address an IPv6 address stands for, and whether its IPv6 block is itself
/// global: IPv4-mapped (`::ffff:a.b.c.d`, the IPv4 address itself on a dual-stack
/// socket), IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`),
/// well-known NAT64 (`64:ff9b::a.b.c.d`), local-use NAT64 (`64:ff9b:1::/48`, read at the
/// /96 position), 6to4 (`2002:aabb:ccdd::…`) and Teredo (`2001::/32`, the client's address
/// inverted in the last 32 bits).
fn embedded_v4(v6: Ipv6Addr) -> Option<(Ipv4Addr, bool)> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let low = v4(s[6], s[7]);
    match s[..6] {
        [0, 0, 0, 0, 0, 0xffff] | [0x64, 0xff9b, 0, 0, 0, 0] => Some((low, true)),
        [0, 0, 0, 0, 0xffff, 0] | [0x64, 0xff9b, 0x0001, ..] => Some((low, false)),
        // :: and ::1 are judged as themselves.
        [0, 0, 0, 0, 0, 0] if !v6.is_loopback() && !v6.is_unspecified() => Some((low, false)),
        [0x2002, ..] => Some((v4(s[1], s[2]), true)),
        [0x2001, 0, ..] => Some((v4(!s[6], !s[7]), false)),
        _ => None,
    }
}

/// Judges a host name before any lookup: the names that are known without DNS.
pub fn check_name(name: &str, allow_private: bool) -> Result<(), Refused> {
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
