//! Whether an address is this machine's own: what may be reached without
//! a token crossing a network.

/// Whether `addr` (`host:port`, an IP or a name) is on this machine's
/// loopback: `127.0.0.0/8`, `[::1]` or `localhost`. Any other name counts
/// as reachable from elsewhere (it is not resolved: the answer must not
/// depend on a DNS server).
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(sock) = addr.parse::<std::net::SocketAddr>() {
        return sock.ip().is_loopback();
    }
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_127_8_the_v6_one_and_localhost_and_nothing_else() {
        for addr in [
            "127.0.0.1:7070",
            "127.3.2.1:1",
            "[::1]:7070",
            "localhost:7070",
            "LOCALHOST:1",
        ] {
            assert!(super::is_loopback(addr), "{addr}");
        }
        for addr in [
            "10.0.0.7:7070",
            "0.0.0.0:7070",
            "[::]:1",
            "node042:7070",
            "localhost.evil.example:1",
            "128.0.0.1:1",
        ] {
            assert!(!super::is_loopback(addr), "{addr}");
        }
    }
}
