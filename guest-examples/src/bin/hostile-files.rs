//! Opens one file again and again without closing any, until it is refused;
//! prints how many it got and why it stopped, then holds them all for the
//! milliseconds given on stdin (default 0) before it exits.
use std::io::Read;

fn main() {
    let mut input = String::new();
    let _ = std::io::stdin().read_to_string(&mut input);
    let hold_ms: u64 = input.trim().parse().unwrap_or(0);
    std::fs::write("/tmp/f", b"x").expect("writing /tmp/f");
    let mut files = Vec::new();
    let stopped = loop {
        if files.len() >= 1_000_000 {
            break "a million opened".to_string();
        }
        match std::fs::File::open("/tmp/f") {
            Ok(f) => files.push(f),
            Err(e) => break e.to_string(),
        }
    };
    println!("opened {} files, then: {stopped}", files.len());
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
}
