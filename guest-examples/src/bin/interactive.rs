//! Interactive: answers each line of stdin as it comes ("echo: LINE"),
//! flushing after each, until stdin ends; then prints how many it read.
//! A harness that writes a line and waits for the answer before the next
//! one hangs unless stdin and stdout both flow while the job runs.
use std::io::{BufRead, Write};

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut n = 0;
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        writeln!(out, "echo: {line}").unwrap();
        out.flush().unwrap();
        n += 1;
    }
    writeln!(out, "{n} lines").unwrap();
}
