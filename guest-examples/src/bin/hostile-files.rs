//! Opens one file again and again without closing any, until it is refused;
//! prints how many it got and why it stopped, then holds them all for the
//! milliseconds given on stdin (default 0) before it exits. The file is
//! its first argument if given (one of a granted directory: a component
//! has no /tmp), else /tmp/f, made first; with a path given, it also
//! says each count on stderr as it goes.
use std::io::Read;

fn main() {
    let mut input = String::new();
    let _ = std::io::stdin().read_to_string(&mut input);
    let hold_ms: u64 = input.trim().parse().unwrap_or(0);
    // With a path given, each count is also said on stderr as it goes: a
    // component whose handle table is full traps, and that says how far
    // it got.
    let tell = std::env::args().nth(1).is_some();
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        std::fs::write("/tmp/f", b"x").expect("writing /tmp/f");
        "/tmp/f".into()
    });
    let mut files = Vec::new();
    let stopped = loop {
        if files.len() >= 1_000_000 {
            break "a million opened".to_string();
        }
        match std::fs::File::open(&path) {
            Ok(f) => {
                files.push(f);
                if tell {
                    eprintln!("{}", files.len());
                }
            }
            Err(e) => break e.to_string(),
        }
    };
    println!("opened {} files, then: {stopped}", files.len());
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
}
