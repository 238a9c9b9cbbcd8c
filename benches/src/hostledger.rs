//! What the host's shared ledger (`worker::hostledger`) costs a
//! reservation: each is decided under the shared file's lock, reading
//! every other worker's record. Reserve-and-release cycles per second on
//! this machine's real memory, alone and with 1 and 7 other workers'
//! ledgers (in this process) on the same file, against a worker that
//! decides alone.

use std::time::Instant;

use peerwasm::worker::HostLedger;
use peerwasm::worker::{Ledger, LedgerConfig};

use crate::Sizes;
use crate::summary::Summary;

pub fn hostledger(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let cycles = sizes.ledger_cycles;
    println!("\n## The host's ledger: one reservation and its release, {cycles} times");
    println!("| workers sharing the file | µs per reservation and release | vs deciding alone |");
    println!("|---|---|---|");
    let config = LedgerConfig {
        memory: Some(1 << 30),
        reserve: 0,
        ..LedgerConfig::default()
    };
    let time = |ledger: &std::sync::Arc<Ledger>| {
        let start = Instant::now();
        for _ in 0..cycles {
            drop(ledger.try_reserve(1 << 20).expect("1 MiB fits"));
        }
        start.elapsed().as_secs_f64() * 1e6 / cycles as f64
    };
    let alone = time(&Ledger::new(&config)?);
    println!("| (none: decides alone) | {alone:.2} | 1.0 |");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("host-ledger");
    let mut worst = alone;
    for others in [0usize, 1, 7] {
        let held: Vec<_> = (0..others)
            .map(|i| {
                let l = Ledger::new(&config).expect("a ledger");
                l.join_host(
                    HostLedger::open(&path, "host".into(), u64::MAX).expect("the file"),
                    &format!("other-{i}"),
                );
                let r = l.try_reserve(64 << 20);
                (l, r)
            })
            .collect();
        let me = Ledger::new(&config)?;
        me.join_host(HostLedger::open(&path, "host".into(), u64::MAX)?, "me");
        let shared = time(&me);
        worst = worst.max(shared);
        println!("| {} | {shared:.2} | {:.1} |", others + 1, shared / alone);
        drop(held);
    }
    summary.figure(
        "host ledger: a reservation and its release, 8 workers on one file",
        format!("{worst:.1} µs ({:.0}× deciding alone)", worst / alone),
        None,
    );
    Ok(())
}
