//! A connection string's hosts, one configuration each, so that each can be
//! connected to with the TLS its kind takes (a unix socket none).

use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// One host of a configuration's list, to connect to on its own.
#[derive(Debug)]
pub(super) struct HostAttempt {
    /// Its place in the list.
    pub(super) index: usize,
    /// The configuration with this host alone (and its address and port).
    pub(super) config: Config,
    /// TCP, where TLS may be used; else a unix socket.
    pub(super) over_tcp: bool,
}

/// One attempt per host of `pg`, in its order, with the pairing of hosts,
/// addresses and ports that tokio-postgres uses; `None` when there is no
/// host or the lists do not line up (tokio-postgres refuses those, saying
/// why).
///
/// A host given only by its address (`hostaddr` without `host`) is also
/// given that address as its name, since a TLS handshake takes one: a
/// certificate is then held to naming the address.
pub(super) fn attempts(pg: &Config) -> Option<Vec<HostAttempt>> {
    let (hosts, addrs, ports) = (pg.get_hosts(), pg.get_hostaddrs(), pg.get_ports());
    let count = hosts.len().max(addrs.len());
    let lined_up =
        (hosts.is_empty() || addrs.is_empty() || hosts.len() == addrs.len()) && (ports.len() <= 1 || ports.len() == count);
    if count == 0 || !lined_up {
        return None;
    }
    let attempts = (0..count)
        .map(|index| {
            let mut config = without_hosts(pg);
            let over_tcp = match (hosts.get(index), addrs.get(index)) {
                (Some(Host::Tcp(name)), addr) => {
                    config.host(name);
                    if let Some(addr) = addr {
                        config.hostaddr(*addr);
                    }
                    true
                }
                #[cfg(unix)]
                (Some(Host::Unix(path)), _) => {
                    config.host_path(path);
                    false
                }
                (None, Some(addr)) => {
                    config.host(addr.to_string()).hostaddr(*addr);
                    true
                }
                (None, None) => unreachable!("index below the longer list's length"),
            };
            if let Some(port) = ports.get(index).or(ports.first()) {
                config.port(*port);
            }
            HostAttempt { index, config, over_tcp }
        })
        .collect();
    Some(attempts)
}

/// `pg` without its hosts, addresses and ports: every other setting copied
/// (tokio-postgres has no way to remove a host from a configuration).
fn without_hosts(pg: &Config) -> Config {
    let mut config = Config::new();
    if let Some(user) = pg.get_user() {
        config.user(user);
    }
    if let Some(password) = pg.get_password() {
        config.password(password);
    }
    if let Some(dbname) = pg.get_dbname() {
        config.dbname(dbname);
    }
    if let Some(options) = pg.get_options() {
        config.options(options);
    }
    if let Some(name) = pg.get_application_name() {
        config.application_name(name);
    }
    if let Some(timeout) = pg.get_connect_timeout() {
        config.connect_timeout(*timeout);
    }
    if let Some(timeout) = pg.get_tcp_user_timeout() {
        config.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = pg.get_keepalives_interval() {
        config.keepalives_interval(interval);
    }
    if let Some(retries) = pg.get_keepalives_retries() {
        config.keepalives_retries(retries);
    }
    config
        .ssl_mode(pg.get_ssl_mode())
        .ssl_negotiation(pg.get_ssl_negotiation())
        .keepalives(pg.get_keepalives())
        .keepalives_idle(pg.get_keepalives_idle())
        .target_session_attrs(pg.get_target_session_attrs())
        .channel_binding(pg.get_channel_binding())
        .load_balance_hosts(pg.get_load_balance_hosts());
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting differs from its default: a setting `without_hosts`
    /// forgot (one a later tokio-postgres adds, say) makes the copy differ.
    #[test]
    fn a_single_host_is_copied_whole() {
        let pg: Config = "host=db.example hostaddr=192.0.2.7 port=6000 user=u password=p dbname=d options=-cx=1 \
                          application_name=a sslmode=require sslnegotiation=direct connect_timeout=7 \
                          tcp_user_timeout=9 keepalives=0 keepalives_idle=11 keepalives_interval=13 \
                          keepalives_retries=3 target_session_attrs=read-write channel_binding=require \
                          load_balance_hosts=random"
            .parse()
            .unwrap();
        let attempts = attempts(&pg).unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].config, pg);
        assert!(attempts[0].over_tcp);
    }

    #[test]
    fn hosts_pair_with_their_addresses_and_ports() {
        let pg: Config = "host=a,/run/pg,c port=1,2,3 user=u".parse().unwrap();
        let three = attempts(&pg).unwrap();
        let shown: Vec<(Vec<Host>, Vec<u16>, bool)> =
            three.iter().map(|a| (a.config.get_hosts().to_vec(), a.config.get_ports().to_vec(), a.over_tcp)).collect();
        assert_eq!(
            shown,
            vec![
                (vec![Host::Tcp("a".into())], vec![1], true),
                (vec![Host::Unix("/run/pg".into())], vec![2], false),
                (vec![Host::Tcp("c".into())], vec![3], true),
            ]
        );
        assert!(three.iter().all(|a| a.config.get_user() == Some("u")));

        let one_port: Config = "host=a,b port=7".parse().unwrap();
        assert!(attempts_of(&one_port).iter().all(|ports| ports == &[7]));
        let by_address: Config = "hostaddr=127.0.0.1".parse().unwrap();
        let attempt = &attempts(&by_address).unwrap()[0];
        assert_eq!(attempt.config.get_hosts(), &[Host::Tcp("127.0.0.1".into())]);
        assert_eq!(attempt.config.get_hostaddrs(), by_address.get_hostaddrs());
    }

    #[test]
    fn lists_that_do_not_line_up_are_left_to_tokio_postgres() {
        for refused in ["host=a,b hostaddr=127.0.0.1", "host=a,b,c port=1,2", "user=u"] {
            assert!(attempts(&refused.parse().unwrap()).is_none(), "{refused}");
        }
    }

    fn attempts_of(pg: &Config) -> Vec<Vec<u16>> {
        attempts(pg).unwrap().iter().map(|a| a.config.get_ports().to_vec()).collect()
    }
}
