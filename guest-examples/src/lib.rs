//! Small jobs for peerwasm's tests and benchmarks. Each binary in `src/bin`
//! builds for wasm32-wasip1 (a core module), wasm32-wasip2 (a component) and
//! natively; the kernels live here so that a benchmark can also call them
//! in-process as a native baseline.
//!
//! | binary | input | does |
//! |---|---|---|
//! | `hello` | args | prints each arg on a line, then `$GREETING` if set |
//! | `primes` | `{"n": N}` (SDK) | `{"count": primes below N}` |
//! | `memhog` | `N` on stdin | allocates and touches N MiB, prints N |
//! | `sleep` | ms on stdin | sleeps that long (wall time) |
//! | `spin` | ms on stdin | burns that much CPU |
//! | `files` | — | copies each file of `/in` to `/out`, upper-cased |
//! | `interactive` | lines on stdin | answers each line as it comes (`echo: LINE`), then counts them |
//! | `ticks` | args COUNT MS | prints `tick i`, sleeping MS between ticks |
//! | `net` | `HOST:PORT` on stdin | tries a TCP connection (a job has no network: it fails, or, as a component, is refused) |
//! | `hostile-loop` | — | loops forever |
//! | `hostile-grow` | — | allocates memory without end |
//! | `hostile-recurse` | — | recurses without end |
//! | `hostile-flood` | — | writes 1 GiB to stdout |
//! | `hostile-exit` | — | exits with code 3 |
//! | `hostile-escape` | — | tries `..`, absolute paths and planted symlinks out of `/tmp` |

use serde::{Deserialize, Serialize};

/// Input of the `primes` job.
#[derive(Debug, Deserialize, Serialize)]
pub struct PrimesInput {
    pub n: u64,
}

/// Output of the `primes` job.
#[derive(Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct PrimesOutput {
    pub count: u64,
}

/// The `primes` job: counts primes below `n` with a sieve.
pub fn primes(input: PrimesInput) -> Result<PrimesOutput, String> {
    if input.n > 1 << 32 {
        return Err(format!("n = {} is too large (at most 2^32)", input.n));
    }
    Ok(PrimesOutput {
        count: count_primes_below(input.n),
    })
}

/// Number of primes p < n (sieve of Eratosthenes over odd numbers).
pub fn count_primes_below(n: u64) -> u64 {
    if n <= 2 {
        return 0;
    }
    // composite[i] is about the odd number 2i + 1. Index arithmetic is in
    // u64: on wasm32 `usize` is 32 bits and p² overflows it.
    let half = n / 2;
    let mut composite = vec![false; half as usize];
    let mut count = 1; // the prime 2
    for i in 1..half {
        if composite[i as usize] {
            continue;
        }
        count += 1;
        let p = 2 * i + 1;
        let mut j = p * p / 2;
        while j < half {
            composite[j as usize] = true;
            j += p;
        }
    }
    count
}

/// Reads all of stdin and parses it as a number (for memhog, sleep, spin).
pub fn stdin_number() -> u64 {
    use std::io::Read;
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .expect("reading stdin");
    match s.trim().parse() {
        Ok(n) => n,
        Err(_) => {
            eprintln!(
                "error: expected a whole number on stdin, got {:?}",
                s.trim()
            );
            std::process::exit(2);
        }
    }
}

/// Allocates `mib` MiB and writes to every page of it; returns a checksum so
/// the work cannot be optimised away.
pub fn hog(mib: u64) -> u64 {
    let mut block = vec![0u8; (mib as usize) << 20];
    for (i, page) in block.chunks_mut(4096).enumerate() {
        page[0] = i as u8;
    }
    block.iter().step_by(4096).map(|&b| b as u64).sum::<u64>()
}

/// Burns CPU for `ms` milliseconds of wall time.
pub fn spin(ms: u64) -> u64 {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    let mut x = 0u64;
    while std::time::Instant::now() < until {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_primes() {
        assert_eq!(count_primes_below(0), 0);
        assert_eq!(count_primes_below(2), 0);
        assert_eq!(count_primes_below(3), 1);
        assert_eq!(count_primes_below(10), 4);
        assert_eq!(count_primes_below(100), 25);
        assert_eq!(count_primes_below(1_000_000), 78_498);
    }
}
