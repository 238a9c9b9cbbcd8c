//! Prints "tick 1", then sleeps, "tick 2", ... : args COUNT (default 2) and
//! MS between ticks (default 2000). Shows whether output arrives as it is
//! written or only when the job ends.
use std::io::Write;

fn main() {
    let mut args = std::env::args().skip(1);
    let count: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    for i in 1..=count {
        if i > 1 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        println!("tick {i}");
        std::io::stdout().flush().unwrap();
    }
}
