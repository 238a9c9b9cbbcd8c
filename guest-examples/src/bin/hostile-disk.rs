//! Fills its scratch directory: a directory tree 64 deep, then 1 MiB at a
//! time into a file until refused (or 4 GiB, so that a run with no bound
//! cannot fill a real disk); prints how much it wrote and why it stopped,
//! then keeps it all for the milliseconds given on stdin (default 0).
use std::io::{Read, Write};
use std::path::PathBuf;

fn main() {
    let mut input = String::new();
    let _ = std::io::stdin().read_to_string(&mut input);
    let hold_ms: u64 = input.trim().parse().unwrap_or(0);
    let mut dir = PathBuf::from("/tmp");
    for i in 0..64 {
        dir.push(format!("d{i}"));
        if let Err(e) = std::fs::create_dir(&dir) {
            println!("mkdir {} refused: {e}", dir.display());
            return;
        }
    }
    let mut file = std::fs::File::create(dir.join("fill")).expect("creating the file");
    let chunk = vec![7u8; 1 << 20];
    let mut written: u64 = 0;
    let stopped = loop {
        if written >= 4 << 30 {
            break "4 GiB written, not refused".to_string();
        }
        match file.write_all(&chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e.to_string(),
        }
    };
    println!("wrote {} MiB, then: {stopped}", written >> 20);
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
}
