//! The gossip core at scale, simulated in one process (the same state
//! machine the workers run, postcard message sizes as sent over HTTP), with
//! 10% of messages lost: rounds to join, rounds for a change to reach 99%
//! of nodes, bytes per node per round, rounds to declare a dead node dead
//! everywhere.

use std::time::Instant;

use peerwasm::gossip::simulation::Simulation;

use crate::Sizes;
use crate::summary::Summary;

/// Larger simulations are skipped when one round of the smaller ones shows
/// they would take longer than this.
const BUDGET_SECS: f64 = 120.0;

pub fn gossip(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    println!("\n## Gossip: simulated nodes, 10% message loss, rounds of 1 s");
    println!(
        "| nodes | join through one seed (rounds) | a change reaches 99% (rounds) | KB/node/round | dead node declared dead by all (rounds) | wall s |"
    );
    println!("|---|---|---|---|---|---|");
    let mut seconds_per_node_round = None::<f64>;
    for &n in &sizes.gossip_nodes {
        // Traffic, and so time, grow as n² per round (docs/gossip.md).
        if let Some(s) = seconds_per_node_round {
            let estimate = s * (n * n) as f64 * 40.0;
            if estimate > BUDGET_SECS {
                println!(
                    "| {n} | skipped: ~{estimate:.0} s estimated from the run above (O(n²) per round) | | | | |"
                );
                summary.figure(
                    format!("gossip, {n} nodes"),
                    "not run: O(n²) traffic per round (docs/gossip.md)",
                    None,
                );
                continue;
            }
        }
        let start = Instant::now();
        let (mut sim, join) = Simulation::joined(n, 0.10, 7);
        let (id, version) = sim.change_record(n / 2, 42);
        let before = sim.bytes_sent();
        let spread = sim.run_until(30, |s| s.share_seeing(&id, version) >= 0.99);
        let rounds = spread.unwrap_or(30);
        let kb = (sim.bytes_sent() - before) as f64 / (n as f64 * rounds as f64) / 1e3;
        let victim = sim.kill(n / 3);
        let dead = sim.run_until(60, |s| s.all_declare_dead(&victim));
        let wall = start.elapsed().as_secs_f64();
        let show = |r: Option<u64>, max: u64| r.map_or(format!("> {max}"), |r| r.to_string());
        println!(
            "| {n} | {join} | {} | {kb:.1} | {} | {wall:.1} |",
            show(spread, 30),
            show(dead, 60)
        );
        seconds_per_node_round =
            Some(wall / ((n * n) as f64 * (join + rounds + dead.unwrap_or(60)) as f64));
        summary.goal(
            format!("gossip, {n} nodes: a change reaches 99%"),
            format!(
                "{} rounds, {kb:.0} KB/node/round; dead declared in {} rounds",
                show(spread, 30),
                show(dead, 60)
            ),
            "≤ 10 rounds",
            spread.is_some_and(|r| r <= 10),
            None,
        );
    }
    Ok(())
}
