//! Holds memory the way an I/O-bound analysis does: reads its input,
//! allocates and touches memory for it, then waits (as for I/O) before it
//! answers — so memory, not the cores, bounds how many run at once.
//!
//! Stdin's first line says how much and how long: `MS xF` holds F × the
//! input's bytes (memory that follows the input, as a parser's does),
//! `MS N` holds N MiB whatever the input; the rest of stdin is the input.
//! An input of one line (as `peerwasm map` gives each line of its inputs
//! file), `MS xF PADDING`, is its own input: F × the line's bytes.
//! `MS N +D` waits D ms before it allocates (a job that grows late).
//! Prints the bytes it held.
use std::io::Read;

fn main() {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .expect("reading stdin");
    let line_end = input
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(input.len());
    let head = String::from_utf8_lossy(&input[..line_end]).into_owned();
    let rest = input.len().saturating_sub(line_end + 1);
    let mut words = head.split_whitespace();
    let (Some(ms), Some(how)) = (
        words.next().and_then(|w| w.parse::<u64>().ok()),
        words.next(),
    ) else {
        eprintln!("error: the first line must be `MS xF` or `MS N`, got {head:?}");
        std::process::exit(2);
    };
    if let Some(delay) = words
        .next()
        .and_then(|w| w.strip_prefix('+'))
        .and_then(|d| d.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(delay));
    }
    let bytes = match how.strip_prefix('x') {
        Some(f) => {
            let of = if rest > 0 { rest } else { input.len() };
            (f.parse::<f64>().unwrap_or(1.0) * of as f64) as usize
        }
        None => how.parse::<usize>().unwrap_or(0) << 20,
    };
    let mut block = vec![0u8; bytes];
    for (i, page) in block.chunks_mut(4096).enumerate() {
        page[0] = i as u8;
    }
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let touched: u64 = block.iter().step_by(4096).map(|&b| b as u64).sum();
    println!("{bytes} {}", touched % 7);
}
