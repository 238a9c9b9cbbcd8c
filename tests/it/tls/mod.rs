//! TLS on every hop, against real worker processes: what a stranger on the
//! path records (a relay between client and worker, and between two
//! workers), certificates that must be refused (another pool's CA, expired,
//! issued for another host), a certificate renewed while the worker runs,
//! the start-up and client refusals of tokens in clear, and `peerwasm tls`
//! itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::support::{PEERWASM, WorkerProcess, spawn_worker};
use crate::tenants::{ALICE, tenants_file};

/// A TCP relay that records every byte it carries, both ways: the view of
/// anyone on the network between two machines. Its threads live as long as
/// the test process.
struct Relay {
    addr: String,
    target: Arc<OnceLock<String>>,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Relay {
    fn start() -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (target, seen) = (
            Arc::new(OnceLock::<String>::new()),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (t, s) = (target.clone(), seen.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Some(to) = t.get() else { continue };
                let Ok(upstream) = TcpStream::connect(to) else {
                    continue;
                };
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, client),
                ] {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let mut recorded = Vec::new();
                        let mut buf = [0u8; 16 << 10];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            recorded.extend_from_slice(&buf[..n]);
                            if into.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = into.shutdown(std::net::Shutdown::Write);
                        s.lock().unwrap().push(recorded);
                    });
                }
            }
        });
        Relay { addr, target, seen }
    }

    /// Where connections go from now on.
    fn forward_to(&self, addr: &str) {
        self.target.set(addr.to_string()).unwrap();
    }

    /// Whether `needle` crossed the relay, either way.
    fn saw(&self, needle: &[u8]) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.windows(needle.len()).any(|w| w == needle))
    }

    fn bytes(&self) -> usize {
        self.seen.lock().unwrap().iter().map(Vec::len).sum()
    }
}

fn peerwasm(args: &[&str]) -> Output {
    Command::new(PEERWASM)
        .args(args)
        .env_remove("PEERWASM_PEERS")
        .env_remove("PEERWASM_TLS_CA")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A pool CA in `dir` and a certificate for 127.0.0.1, made with the CLI.
/// Returns the worker's flags.
fn pool_tls(dir: &Path) -> Vec<String> {
    let tls = dir.join("tls");
    let out = peerwasm(&["tls", "init", tls.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = peerwasm(&["tls", "issue", tls.to_str().unwrap(), "127.0.0.1"]);
    assert!(out.status.success(), "{}", text(&out));
    worker_flags(&tls, "127.0.0.1")
}

fn worker_flags(tls: &Path, name: &str) -> Vec<String> {
    let file = |f: String| tls.join(f).to_str().unwrap().to_string();
    vec![
        "--tls-cert".into(),
        file(format!("{name}.crt")),
        "--tls-key".into(),
        file(format!("{name}.key")),
        "--tls-ca".into(),
        file("ca.crt".into()),
    ]
}

/// A free loopback port, to listen on when the worker advertises another
/// address (the relay's).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a relay in front of worker B recorded while a client ran a job on
/// B through it and a map owned by worker A placed its jobs on B (A is too
/// small for them): the token, a job's stdin and a map's inputs, in clear
/// or not.
fn what_the_path_sees(tls: bool) -> (Relay, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let tls_flags = if tls {
        pool_tls(dir.path())
    } else {
        Vec::new()
    };
    let key = dir.path().join("pool.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let tenants = tenants_file(1, 1);
    let mut common: Vec<String> = vec!["--tenants".into(), tenants.path().to_str().unwrap().into()];
    common.extend(["--cluster-key".into(), key.to_str().unwrap().into()]);
    common.extend(tls_flags.iter().cloned());

    // B is reached by everyone through the relay only: it advertises it.
    let relay = Relay::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(PEERWASM);
    cmd.args([
        "worker",
        "--listen",
        &listen,
        "--advertise",
        &relay.addr,
        "--memory",
        "1GiB",
        "--reserve",
        "0",
    ])
    .args([
        "--slots",
        "2",
        "--gossip-interval",
        "100ms",
        "--host-ledger",
    ])
    .arg(cache.path().join("ledger"))
    .arg("--cache-dir")
    .arg(cache.path())
    .args(&common)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    relay.forward_to(&listen);
    let (b_child, b_addr) = spawn_worker(&mut cmd);
    let _b = KillOnDrop(b_child);
    assert_eq!(b_addr, relay.addr);
    // A joins through the relay and cannot fit a 64 MiB job itself.
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let a = WorkerProcess::start_with("48MiB", 1, Some(&relay.addr), &common);

    let mut client: Vec<String> = vec![
        "--token".into(),
        ALICE.into(),
        "--mem".into(),
        "64MiB".into(),
    ];
    if tls {
        client.extend([
            "--tls-ca".into(),
            dir.path().join("tls/ca.crt").to_str().unwrap().into(),
        ]);
    }
    let client: Vec<&str> = client.iter().map(String::as_str).collect();
    let guest = peerwasm_testkit::guest_wasm("interactive");
    let guest = guest.to_str().unwrap();

    // Wait until A sees B (gossip through the relay).
    let transport = match tls {
        true => peerwasm::net::Transport::tls(&dir.path().join("tls/ca.crt")).unwrap(),
        false => peerwasm::net::Transport::plain(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(crate::pool::wait_for_via(
        &crate::pool::operator(&transport),
        &a.addr,
        Duration::from_secs(20),
        |v| crate::pool::alive(v) == 2,
    ));

    // The client's hop: a job on B, its stdin a secret.
    let mut args = vec!["run", "--peers", &relay.addr];
    args.extend(&client);
    args.push(guest);
    let out = crate::support::output_within(
        Command::new(PEERWASM)
            .args(&args)
            .env_remove("PEERWASM_TLS_CA"),
        b"client-stdin-secret\n",
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && text(&out).contains("echo: client-stdin-secret"),
        "{}",
        text(&out)
    );

    // The workers' hop: a map that A owns, its jobs on B.
    let inputs = dir.path().join("inputs.txt");
    std::fs::write(
        &inputs,
        (0..4)
            .map(|i| format!("owner-input-secret-{i}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let mut args = vec!["map", "--detach", "--peers", &a.addr];
    args.extend(&client);
    args.extend([guest, inputs.to_str().unwrap()]);
    let out = peerwasm(&args);
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut args = vec!["results", "--peers", &a.addr];
    args.extend(client.iter().filter(|a| !["--mem", "64MiB"].contains(a)));
    args.push(&id);
    let out = crate::support::output_within(
        Command::new(PEERWASM).args(&args),
        b"",
        Duration::from_secs(60),
    );
    let results = text(&out);
    assert!(out.status.success(), "{results}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 4, "{results}");
    (relay, lines)
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod refusals;

#[test]
fn with_tls_neither_the_token_nor_stdin_nor_inputs_cross_the_wire_in_clear() {
    let (relay, results) = what_the_path_sees(true);
    for (i, line) in results.iter().enumerate() {
        assert!(
            line.contains(&format!("owner-input-secret-{i}")) && line.contains(&relay.addr),
            "ran on B: {line}"
        );
    }
    assert!(
        relay.bytes() > 10_000,
        "the relay carried the jobs ({} bytes)",
        relay.bytes()
    );
    for secret in [ALICE, "client-stdin-secret", "owner-input-secret"] {
        assert!(
            !relay.saw(secret.as_bytes()),
            "{secret} crossed the relay in clear"
        );
    }
}

#[test]
fn without_tls_the_path_reads_the_token_stdin_and_inputs() {
    // The control: the same relay, the same jobs, plain HTTP.
    let (relay, results) = what_the_path_sees(false);
    assert!(
        results.iter().all(|l| l.contains(&relay.addr)),
        "ran on B: {results:?}"
    );
    for secret in [ALICE, "client-stdin-secret", "owner-input-secret-3"] {
        assert!(
            relay.saw(secret.as_bytes()),
            "{secret} did not cross the relay: is the recorder blind?"
        );
    }
}

/// Starts a worker on 127.0.0.1 serving `cert` (a name in `tls`).
fn tls_worker(tls: &Path, cert: &str) -> WorkerProcess {
    let flags = worker_flags(tls, cert);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    WorkerProcess::start_with("1GiB", 1, None, &flags)
}

/// `peerwasm run` of a job on `addr` trusting `ca`: its output.
fn run_on(addr: &str, ca: Option<&Path>) -> Output {
    let guest = peerwasm_testkit::guest_wasm("hello");
    let mut cmd = Command::new(PEERWASM);
    cmd.args(["run", "--peers", addr])
        .env_remove("PEERWASM_TLS_CA");
    if let Some(ca) = ca {
        cmd.arg("--tls-ca").arg(ca);
    }
    crate::support::output_within(cmd.arg(guest), b"", Duration::from_secs(60))
}

/// The jobs a worker has run, from its metrics (asked over TLS with `ca`).
fn jobs_run(addr: &str, ca: &Path) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http =
        peerwasm::client::http_client(None, &peerwasm::net::Transport::tls(ca).unwrap()).unwrap();
    let body = runtime.block_on(async {
        http.get(http.url(addr, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    body.lines()
        .filter(|l| l.starts_with("peerwasm_jobs_total{"))
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|n| n.parse::<f64>().ok())
                .expect("a count") as u64
        })
        .sum()
}

#[test]
fn another_pools_ca_an_expired_or_misnamed_certificate_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let ca = tls.join("ca.crt");
    peerwasm::net::certs::init(&tls).unwrap();
    let now = std::time::SystemTime::now();
    let year = peerwasm::net::certs::DEFAULT_VALIDITY;
    let loopback = ["127.0.0.1".to_string()];
    peerwasm::net::certs::issue(&tls, &loopback, Some("good"), now, now + year).unwrap();
    peerwasm::net::certs::issue(&tls, &loopback, Some("expired"), now - 2 * year, now - year)
        .unwrap();
    peerwasm::net::certs::issue(
        &tls,
        &["elsewhere.example".to_string()],
        Some("misnamed"),
        now,
        now + year,
    )
    .unwrap();
    let other_ca = peerwasm::net::certs::init(&dir.path().join("other")).unwrap();

    let good = tls_worker(&tls, "good");
    let refusals: [(&WorkerProcess, Option<&Path>, &str); 2] = [
        (
            &good,
            Some(&other_ca),
            "not signed by the CA this side trusts",
        ),
        (&good, None, "does this worker serve TLS?"),
    ];
    let expired = tls_worker(&tls, "expired");
    let misnamed = tls_worker(&tls, "misnamed");
    let more: [(&WorkerProcess, Option<&Path>, &str); 2] = [
        (&expired, Some(&ca), "certificate has expired"),
        (
            &misnamed,
            Some(&ca),
            "not for the address it was reached at",
        ),
    ];
    for (worker, trusting, why) in refusals.into_iter().chain(more) {
        let out = run_on(&worker.addr, trusting);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains(why),
            "expected {why:?} in:\n{}",
            text(&out)
        );
        assert!(!text(&out).contains("hello"), "the job ran: {}", text(&out));
    }
    // Nothing ran on the good worker; a client trusting its CA runs there.
    assert_eq!(jobs_run(&good.addr, &ca), 0);
    let out = run_on(&good.addr, Some(&ca));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(jobs_run(&good.addr, &ca), 1);

    // A TLS client meeting a plain-HTTP worker says so.
    let plain = WorkerProcess::start("1GiB", 1, None);
    let out = run_on(&plain.addr, Some(&ca));
    assert!(text(&out).contains("does not speak TLS"), "{}", text(&out));
}

#[test]
fn a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let ca = tls.join("ca.crt");
    peerwasm::net::certs::init(&tls).unwrap();
    let (now, year) = (
        std::time::SystemTime::now(),
        peerwasm::net::certs::DEFAULT_VALIDITY,
    );
    let loopback = ["127.0.0.1".to_string()];
    // The worker starts with a certificate that has run out.
    peerwasm::net::certs::issue(&tls, &loopback, Some("w"), now - 2 * year, now - year).unwrap();
    let worker = tls_worker(&tls, "w");
    let out = run_on(&worker.addr, Some(&ca));
    assert!(
        text(&out).contains("certificate has expired"),
        "{}",
        text(&out)
    );

    // Renewed in place, as `peerwasm tls issue` (or certbot) would: the
    // same worker serves the new one, with no restart.
    peerwasm::net::certs::issue(&tls, &loopback, Some("w"), now, now + year).unwrap();
    std::thread::sleep(peerwasm::net::tls::RELOAD_CHECK_EVERY + Duration::from_millis(500));
    let out = run_on(&worker.addr, Some(&ca));
    assert!(
        out.status.success(),
        "the renewed certificate is not served: {}",
        text(&out)
    );

    // A certificate file overwritten with something that is not one (a
    // renewal half done): the worker keeps serving the good one it has.
    std::fs::write(tls.join("w.crt"), "not a certificate").unwrap();
    std::thread::sleep(peerwasm::net::tls::RELOAD_CHECK_EVERY + Duration::from_millis(500));
    for _ in 0..2 {
        let out = run_on(&worker.addr, Some(&ca));
        assert!(
            out.status.success(),
            "a broken file replaced the good certificate: {}",
            text(&out)
        );
    }
    assert_eq!(jobs_run(&worker.addr, &ca), 3);
}

/// A stranger who opens connections to a TLS worker and stalls before or
/// inside the handshake holds each no longer than the header timeout, and
/// the worker answers others meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_handshake_holds_a_connection_no_longer_than_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut flags = pool_tls(dir.path());
    flags.extend(["--header-timeout".into(), "1s".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let w = WorkerProcess::start_with("1GiB", 1, None, &flags);
    let mut stalled = Vec::new();
    for i in 0..6 {
        let mut s = tokio::net::TcpStream::connect(&w.addr).await.unwrap();
        if i % 2 == 1 {
            // The first bytes of a ClientHello record, and no more.
            s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                .await
                .unwrap();
        }
        stalled.push(s);
    }
    let opened = std::time::Instant::now();
    let transport = peerwasm::net::Transport::tls(&dir.path().join("tls/ca.crt")).unwrap();
    let t = std::time::Instant::now();
    crate::pool::view_via(
        &peerwasm::client::http_client(None, &transport).unwrap(),
        &w.addr,
    )
    .await;
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the pool view took {:?} beside stalled handshakes",
        t.elapsed()
    );
    for mut s in stalled {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a stalled handshake outlived the header timeout: {closed:?}"
        );
    }
    assert!(
        opened.elapsed() >= Duration::from_millis(800),
        "closed before the timeout: {:?}",
        opened.elapsed()
    );
}
