//! Which resolved addresses the proxy may connect to. A domain rule allows a *name*; what the
//! name resolves to is checked here, on the very address the proxy then connects to, so a name
//! pointed at 169.254.169.254 or 127.0.0.1 (by its owner, or by a rebinding DNS server) does not
//! reach the cloud metadata service or the host's own services.
//!
//! Order of the check: corral's own listeners are refused first and always; then an explicit
//! allowed network admits an address; then the classes below, and the host's own addresses.
//! IPv4-mapped IPv6 (`::ffff:127.0.0.1`) is judged as the IPv4 address it is, and so are the
//! IPv4 addresses embedded in NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// A network in CIDR notation: `10.0.0.0/8`, `fd00::/8`, `127.0.0.2/32`; a bare address is
/// that one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

/// A network that does not parse: its text and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetError {
    pub text: String,
    pub why: String,
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not a network: {}", self.text, self.why)
    }
}

impl std::error::Error for NetError {}

impl FromStr for Net {
    type Err = NetError;

    fn from_str(text: &str) -> Result<Net, NetError> {
        let err = |why: String| NetError {
            text: text.to_string(),
            why,
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| err(format!("`{addr}` is not an IP address")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(err(format!("the prefix length is 0 to {max}"))),
            },
        };
        let net = Net { addr, prefix };
        // `10.0.0.1/8` is most likely a typo for a host or for 10.0.0.0/8: refuse, name both.
        let base = net.base();
        if base != addr {
            return Err(err(format!(
                "bits are set beyond the prefix; did you mean {base}/{prefix}?"
            )));
        }
        Ok(net)
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Net {
    /// The address with the bits beyond the prefix cleared.
    fn base(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(self.prefix))),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// The address classes that are never reached unless an allowed network covers them, in the
/// words a refusal uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Unspecified,
    Loopback,
    LinkLocal,
    Multicast,
    Broadcast,
    Reserved,
    Private,
}

impl Class {
    fn reason(self) -> &'static str {
        match self {
            Class::Unspecified => "unspecified",
            Class::Loopback => "loopback",
            Class::LinkLocal => "link-local (cloud metadata)",
            Class::Multicast => "multicast",
            Class::Broadcast => "broadcast",
            Class::Reserved => "documentation/reserved",
            Class::Private => "private range",
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it reaches; any other address unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u8) -> bool {
    u32::from(ip) & mask32(prefix) == u32::from(Ipv4Addr::from(net))
}

fn class_v4(ip: Ipv4Addr) -> Option<Class> {
    let o = ip.octets();
    Some(match o {
        [0, ..] => Class::Unspecified, // 0/8: "this network"; Linux connects 0.x to itself
        [127, ..] => Class::Loopback,
        [169, 254, ..] => Class::LinkLocal,
        [224..=239, ..] => Class::Multicast,
        [255, 255, 255, 255] => Class::Broadcast,
        [240..=255, ..] => Class::Reserved,
        [10, ..] | [192, 168, ..] => Class::Private,
        [172, 16..=31, ..] => Class::Private,
        _ if in_v4(ip, [100, 64, 0, 0], 10) => Class::Private, // CGNAT
        [192, 0, 0, _] | [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => Class::Reserved,
        [198, 18..=19, ..] => Class::Reserved, // benchmarking
        _ => return None,
    })
}

fn class_v6(ip: Ipv6Addr) -> Option<Class> {
    let bits = u128::from(ip);
    let seg = ip.segments();
    let embedded = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    if ip.is_unspecified() {
        return Some(Class::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Class::Loopback);
    }
    Some(match seg[0] {
        // ::/96 (IPv4-compatible, deprecated) and ::ffff:0:0:0/96 (IPv4-translated).
        0 if bits >> 32 == 0 || bits >> 32 == 0xffff_0000 => Class::Reserved,
        // NAT64's well-known prefix and 6to4 reach an IPv4 address: judge that one.
        0x64 if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 => return class_v4(embedded(0)),
        0x2002 => return class_v4(embedded(80)),
        0xfe80..=0xfebf => Class::LinkLocal,
        0xfec0..=0xfeff => Class::Reserved, // site-local, deprecated
        0xff00..=0xffff => Class::Multicast,
        0xfc00..=0xfdff => Class::Private,
        0x2001 if seg[1] == 0x0db8 => Class::Reserved, // documentation
        0x3fff if seg[1] <= 0x0fff => Class::Reserved, // documentation (RFC 9637)
        0x0100 if bits >> 64 == 0x0100_0000_0000_0000 => Class::Reserved, // discard
        _ => return None,
    })
}

fn class(ip: IpAddr) -> Option<Class> {
    match canonical(ip) {
        IpAddr::V4(v4) => class_v4(v4),
        IpAddr::V6(v6) => class_v6(v6),
    }
}

/// The address policy of one proxy.
#[derive(Clone, Debug, Default)]
pub struct Addresses {
    allow_private: bool,
    allowed_nets: Vec<Net>,
    /// corral's own listeners; an unspecified address means every local address, that port.
    never: Vec<SocketAddr>,
    /// The host's interface addresses, read once.
    own: HashSet<IpAddr>,
    /// The broadcast addresses of the host's interfaces (`10.0.0.255`).
    own_broadcast: HashSet<IpAddr>,
}

impl Addresses {
    /// Reads the host's interface addresses once (`getifaddrs`); if that fails, the classes
    /// still apply and the failure is logged.
    pub fn new(allow_private: bool, allowed_nets: &[Net], never: Vec<SocketAddr>) -> Addresses {
        let (mut own, mut own_broadcast) = (HashSet::new(), HashSet::new());
        match nix::ifaddrs::getifaddrs() {
            Ok(ifaddrs) => {
                let ip = |a: &nix::sys::socket::SockaddrStorage| {
                    a.as_sockaddr_in()
                        .map(|s| IpAddr::V4(s.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
                };
                for ifa in ifaddrs {
                    own.extend(ifa.address.as_ref().and_then(ip).map(canonical));
                    own_broadcast.extend(ifa.broadcast.as_ref().and_then(ip).map(canonical));
                }
            }
            Err(e) => tracing::warn!("egress proxy: reading the host's addresses: {e}"),
        }
        Addresses {
            allow_private,
            allowed_nets: allowed_nets.to_vec(),
            never,
            own,
            own_broadcast,
        }
    }

    /// Whether the proxy may connect to `addr`; if not, why, in a refusal's words.
    pub fn check(&self, addr: SocketAddr) -> Result<(), &'static str> {
        let ip = canonical(addr.ip());
        if self
            .never
            .iter()
            .any(|l| self.is_listener(*l, ip, addr.port()))
        {
            return Err("corral's own listener");
        }
        let raw = addr.ip();
        if self
            .allowed_nets
            .iter()
            .any(|n| n.contains(ip) || n.contains(raw))
        {
            return Ok(());
        }
        // Before the classes: a subnet's broadcast address is usually in a private range.
        if self.own_broadcast.contains(&ip) {
            return Err(Class::Broadcast.reason());
        }
        match class(ip) {
            Some(Class::Private) if self.allow_private => {}
            Some(c) => return Err(c.reason()),
            None => {}
        }
        if self.own.contains(&ip) {
            return Err("the host's own address");
        }
        Ok(())
    }

    /// Whether connecting to `ip:port` reaches `listener`.
    fn is_listener(&self, listener: SocketAddr, ip: IpAddr, port: u16) -> bool {
        if listener.port() != port {
            return false;
        }
        let at = canonical(listener.ip());
        if at.is_unspecified() {
            // Bound to every local address: loopback, the unspecified address (Linux connects
            // it to the host), and each interface address.
            return matches!(class(ip), Some(Class::Loopback | Class::Unspecified))
                || self.own.contains(&ip);
        }
        at == ip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Net {
        s.parse().expect(s)
    }

    fn at(s: &str) -> SocketAddr {
        s.parse().expect(s)
    }

    #[test]
    fn networks_parse_and_contain() {
        assert!(net("127.0.0.2/32").contains("127.0.0.2".parse().expect("ip")));
        assert!(!net("127.0.0.2/32").contains("127.0.0.3".parse().expect("ip")));
        assert!(net("10.0.0.0/8").contains("10.255.1.2".parse().expect("ip")));
        assert!(!net("10.0.0.0/8").contains("11.0.0.1".parse().expect("ip")));
        assert!(net("fd00::/8").contains("fd12::1".parse().expect("ip")));
        assert!(!net("fd00::/8").contains("fe00::1".parse().expect("ip")));
        assert!(!net("10.0.0.0/8").contains("::ffff:10.0.0.1".parse().expect("ip")));
        assert!(net("0.0.0.0/0").contains("8.8.8.8".parse().expect("ip")));
        assert!(net("::/0").contains("2001:4860::1".parse().expect("ip")));
        assert_eq!(net("192.0.2.7"), net("192.0.2.7/32"));
        assert_eq!(net("fd00::/8").to_string(), "fd00::/8");
    }

    #[test]
    fn bad_networks_say_why() {
        for (text, why) in [
            ("10.0.0.1/8", "did you mean 10.0.0.0/8?"),
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0.0/x", "0 to 32"),
            ("example.com/8", "not an IP address"),
            ("", "not an IP address"),
        ] {
            let err = text.parse::<Net>().expect_err(text).to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    /// A policy whose host addresses are given, not read from this machine.
    fn policy(allow_private: bool, nets: &[&str], never: &[&str], own: &[&str]) -> Addresses {
        Addresses {
            allow_private,
            allowed_nets: nets.iter().map(|n| net(n)).collect(),
            never: never.iter().map(|a| at(a)).collect(),
            own: own.iter().map(|a| a.parse().expect(a)).collect(),
            own_broadcast: ["10.1.2.255".parse().expect("ip")].into(),
        }
    }

    #[test]
    fn internal_classes_are_refused_with_their_reason() {
        let p = policy(false, &[], &[], &["203.0.114.9", "2001:4860::9"]);
        for (addr, want) in [
            ("127.0.0.1:80", "loopback"),
            ("127.8.9.10:80", "loopback"),
            ("[::1]:80", "loopback"),
            ("[::ffff:127.0.0.1]:80", "loopback"),
            ("169.254.169.254:80", "link-local (cloud metadata)"),
            ("[::ffff:169.254.169.254]:80", "link-local (cloud metadata)"),
            ("[fe80::1]:80", "link-local (cloud metadata)"),
            ("[64:ff9b::a9fe:a9fe]:80", "link-local (cloud metadata)"),
            ("[2002:7f00:1::]:80", "loopback"),
            ("0.0.0.0:80", "unspecified"),
            ("0.1.2.3:80", "unspecified"),
            ("[::]:80", "unspecified"),
            ("224.0.0.1:80", "multicast"),
            ("[ff02::1]:80", "multicast"),
            ("255.255.255.255:80", "broadcast"),
            ("10.1.2.255:80", "broadcast"),
            ("192.0.2.1:80", "documentation/reserved"),
            ("240.0.0.1:80", "documentation/reserved"),
            ("[2001:db8::1]:80", "documentation/reserved"),
            ("[::7f00:1]:80", "documentation/reserved"),
            ("10.0.0.1:80", "private range"),
            ("172.16.0.1:80", "private range"),
            ("172.31.255.255:80", "private range"),
            ("192.168.1.1:80", "private range"),
            ("100.64.0.1:80", "private range"),
            ("[fd00::1]:80", "private range"),
            ("[::ffff:10.0.0.1]:80", "private range"),
            ("203.0.114.9:80", "the host's own address"),
            ("[::ffff:203.0.114.9]:80", "the host's own address"),
            ("[2001:4860::9]:80", "the host's own address"),
        ] {
            assert_eq!(p.check(at(addr)), Err(want), "{addr}");
        }
        for addr in [
            "8.8.8.8:443",
            "172.32.0.1:80",
            "100.128.0.1:80",
            "[2606:4700::1]:443",
            "[::ffff:1.1.1.1]:443",
            "[64:ff9b::808:808]:53",
        ] {
            assert_eq!(p.check(at(addr)), Ok(()), "{addr}");
        }
    }

    #[test]
    fn allow_private_admits_private_ranges_only() {
        let p = policy(true, &[], &[], &["10.9.9.9"]);
        assert_eq!(p.check(at("10.0.0.1:80")), Ok(()));
        assert_eq!(p.check(at("[fd00::1]:80")), Ok(()));
        assert_eq!(p.check(at("10.9.9.9:80")), Err("the host's own address"));
        assert_eq!(p.check(at("127.0.0.1:80")), Err("loopback"));
        assert_eq!(
            p.check(at("169.254.169.254:80")),
            Err("link-local (cloud metadata)")
        );
    }

    #[test]
    fn an_allowed_network_admits_any_class_but_never_corrals_listeners() {
        let p = policy(
            false,
            &["127.0.0.0/8", "169.254.169.254/32"],
            &["127.0.0.1:7000", "0.0.0.0:7001", "[::]:7002"],
            &["198.51.99.1"],
        );
        assert_eq!(p.check(at("127.0.0.1:8080")), Ok(()));
        assert_eq!(p.check(at("[::ffff:127.0.0.5]:8080")), Ok(()));
        assert_eq!(p.check(at("169.254.169.254:80")), Ok(()));
        assert_eq!(
            p.check(at("169.254.169.253:80")),
            Err("link-local (cloud metadata)")
        );
        for addr in [
            "127.0.0.1:7000",
            "[::ffff:127.0.0.1]:7000",
            "127.0.0.1:7001",
            "127.0.0.9:7001",
            "0.0.0.0:7001",
            "198.51.99.1:7001",
            "127.0.0.1:7002",
            "[::1]:7002",
        ] {
            assert_eq!(p.check(at(addr)), Err("corral's own listener"), "{addr}");
        }
        // Same ports elsewhere are not the listener.
        assert_eq!(p.check(at("127.0.0.2:7000")), Ok(()));
        assert_eq!(p.check(at("8.8.8.8:7001")), Ok(()));
    }

    #[test]
    fn the_hosts_own_addresses_are_read() {
        let p = Addresses::new(false, &[], Vec::new());
        // Whatever this machine's interfaces are, each public one is refused as the host's own.
        assert!(p.own.iter().all(|ip| *ip == canonical(*ip)));
        for ip in p.own.iter().filter(|ip| class(**ip).is_none()) {
            assert_eq!(
                p.check(SocketAddr::new(*ip, 80)),
                Err("the host's own address"),
                "{ip}"
            );
        }
    }
}
