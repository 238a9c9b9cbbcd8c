use super::*;

#[test]
fn a_bare_host_or_port_0_advertises_the_port_bound() {
    let bound: SocketAddr = "0.0.0.0:41234".parse().unwrap();
    assert_eq!(advertised(None, bound), "0.0.0.0:41234");
    assert_eq!(advertised(Some("node7"), bound), "node7:41234");
    assert_eq!(advertised(Some("node7:0"), bound), "node7:41234");
    assert_eq!(advertised(Some("node7:7070"), bound), "node7:7070");
    assert_eq!(advertised(Some("[::1]"), bound), "[::1]:41234");
    assert_eq!(advertised(Some("[::1]:9"), bound), "[::1]:9");
    assert_eq!(split_host_port("10.0.0.1:80"), ("10.0.0.1", Some(80)));
}
