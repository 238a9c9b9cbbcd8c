//! The smartshare seed's experiment, with fair share on and off: one slot,
//! tenant A maps 10 jobs of 1 unit, tenant B 10 jobs of 10 units, started
//! together, on a real worker over loopback HTTP. Fluid fair share predicts
//! A finishing 5.5× sooner than B; first-come order about 1.1×.

use std::time::{Duration, Instant};

use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::ModuleHash;
use peerwasm::runner::RunnerConfig;
use peerwasm::server::{WorkerConfig, start};
use peerwasm::worker::LedgerConfig;
use peerwasm::worker::Tenants;

const MIB: u64 = 1 << 20;

fn tenants() -> anyhow::Result<Tenants> {
    let sha = |t: &str| ModuleHash::of(t.as_bytes()).to_hex();
    Tenants::parse(&format!(
        "[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{}\"\n[[tenant]]\nname = \"b\"\ntoken_sha256 = \"{}\"\n\
         [[tenant]]\nname = \"warm\"\ntoken_sha256 = \"{}\"\n",
        sha("a"),
        sha("b"),
        sha("warm")
    ))
}

async fn sleep_map(
    addr: &str,
    token: &str,
    count: usize,
    ms: u64,
    job: &Job,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let target = Target::pool_as(vec![addr.to_string()], Some(token.into()))?;
    let config = MapConfig {
        mem: Some((32 * MIB).into()),
        ..MapConfig::default()
    };
    let mut items: Vec<MapItem> = Vec::new();
    map(
        &target,
        job,
        vec![format!("{ms}\n").into_bytes(); count],
        &config,
        &mut items,
    )
    .await?;
    anyhow::ensure!(items.iter().all(MapItem::succeeded), "a sleep job failed");
    Ok(start.elapsed())
}

/// (A's finish, B's finish) with fair share on or off.
async fn experiment(unit_ms: u64, fair_share: bool) -> anyhow::Result<(Duration, Duration)> {
    let mut runner = RunnerConfig::default();
    runner.sandbox.slots = 1;
    let config = WorkerConfig {
        runner,
        ledger: LedgerConfig {
            memory: Some(1 << 30),
            reserve: 0,
            ..LedgerConfig::default()
        },
        gossip_interval: Duration::from_millis(200),
        tenants: tenants()?,
        fair_share,
        ..WorkerConfig::new("127.0.0.1:0".parse()?)
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = start(config, async move {
        let _ = stop_rx.await;
    })
    .await?;
    let addr = worker.addr.to_string();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    // Compile before the clock starts, as a third tenant.
    let warm = Target::pool_as(vec![addr.clone()], Some("warm".into()))?;
    warm.run(&job, job.spec(b"1".to_vec(), 32 * MIB)).await?;
    let (a, b) = tokio::join!(
        sleep_map(&addr, "a", 10, unit_ms, &job),
        sleep_map(&addr, "b", 10, 10 * unit_ms, &job)
    );
    let _ = stop_tx.send(());
    Ok((a?, b?))
}

/// Runs the experiment with fair share on and off; prints both ratios.
pub fn fairness(sizes: &crate::Sizes, summary: &mut crate::summary::Summary) -> anyhow::Result<()> {
    let unit_ms = sizes.fairness_unit_ms;
    println!("\n## Fairness: the smartshare seed's experiment, unit {unit_ms} ms, one slot");
    println!("| fair share | A done | B done | B / A | elapsed vs 110 units of work |");
    println!("|---|---|---|---|---|");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut ratios = Vec::new();
    for on in [true, false] {
        let (a, b) = rt.block_on(experiment(unit_ms, on))?;
        ratios.push(b.as_secs_f64() / a.as_secs_f64());
        let work = Duration::from_millis(110 * unit_ms);
        println!(
            "| {} | {:.2} s | {:.2} s | {:.2}× | {:.3}× |",
            if on { "on" } else { "off (arrival order)" },
            a.as_secs_f64(),
            b.as_secs_f64(),
            b.as_secs_f64() / a.as_secs_f64(),
            a.max(b).as_secs_f64() / work.as_secs_f64()
        );
    }
    summary.figure(
        "fairness: B / A finish, fair share on vs off",
        format!(
            "{:.2}× vs {:.2}× (fluid model: 5.5× vs ~1.1×)",
            ratios[0], ratios[1]
        ),
        Some("Slurm fair-share and HTCondor user priorities order jobs alike"),
    );
    Ok(())
}
