//! Hostile: writes 1 GiB to stdout.
use std::io::Write;

fn main() {
    let chunk = vec![b'x'; 1 << 16];
    let mut out = std::io::stdout().lock();
    for _ in 0..(1 << 14) {
        if out.write_all(&chunk).is_err() {
            std::process::exit(1);
        }
    }
}
