//! The names browsers may reach the gateway by (`--allowed-hosts`).
//!
//! A page can rebind its own DNS name to the gateway's address (DNS
//! rebinding): its requests then carry `Host: attacker.example` and `Origin:
//! http://attacker.example`, which match, so the check of `Origin` against
//! `Host` alone would let it write, and read what it is answered. Its `Host`
//! is the attacker's name, though, and that is what this refuses: a
//! browser's request is served only when its `Host` is an IP address (a page
//! cannot rebind a literal address), `localhost`, or a name the operator
//! allowed.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The names, besides IP addresses and `localhost`, that browsers' requests
/// may carry in `Host`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lower case, without a trailing dot.
    names: Vec<String>,
    /// `*` was given: every name is allowed.
    any: bool,
}

impl AllowedHosts {
    /// Host names as given (`stile.example.com`; a port, if given, is
    /// ignored); `*` allows any.
    pub fn new(names: impl IntoIterator<Item = String>) -> AllowedHosts {
        let mut allowed = AllowedHosts::default();
        for name in names {
            let name = name.trim();
            if name == "*" {
                allowed.any = true;
            } else if let Some(name) = host_name(name) {
                allowed.names.push(name);
            }
        }
        allowed
    }

    /// Whether a `Host` header's value names the gateway by an allowed name.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(name) = host_name(host) else { return false };
        is_ip_literal(&name) || name == "localhost" || self.names.contains(&name)
    }
}

/// The name part of a `Host` value (`name`, `name:port`, `[v6]:port`), in
/// lower case and without a trailing dot; `None` when it is not of that
/// shape.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')?;
        let (name, rest) = host.split_at(end + 1);
        (name, if rest.is_empty() { None } else { Some(rest.strip_prefix(':')?) })
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if port.is_some_and(|port| port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

fn is_ip_literal(name: &str) -> bool {
    match name.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok(),
        None => name.parse::<Ipv4Addr>().is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_localhost_are_allowed_other_names_only_when_given() {
        let default = AllowedHosts::default();
        for host in
            ["127.0.0.1:6632", "127.0.0.1", "[::1]:6632", "[::1]", "10.1.2.3:80", "localhost:6632", "LOCALHOST.", "localhost"]
        {
            assert!(default.allows(host), "{host}");
        }
        for host in [
            "attacker.example:16800",
            "attacker.example",
            "127.0.0.1.nip.io:6632",
            "localhost.attacker.example",
            "evil.localhost:1",
            "[::1",
            "[not-v6]:1",
            "127.0.0.1:",
            "127.0.0.1:x",
            ":6632",
            "",
        ] {
            assert!(!default.allows(host), "{host}");
        }
        let named = AllowedHosts::new(["Stile.Example.com".to_owned(), " queue.internal:6632 ".to_owned()]);
        for host in ["stile.example.com:443", "STILE.EXAMPLE.COM", "queue.internal:1", "127.0.0.1:6632"] {
            assert!(named.allows(host), "{host}");
        }
        assert!(!named.allows("attacker.example:6632"));
        assert!(AllowedHosts::new(["*".to_owned()]).allows("attacker.example:6632"));
    }
}
