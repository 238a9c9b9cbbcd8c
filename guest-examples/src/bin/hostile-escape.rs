//! Tries to reach the host's files from its scratch directory (`/tmp`):
//! `..`, absolute paths, and symlinks it plants itself, pointing out. Prints
//! one line per attempt; exits 1 if any attempt read or wrote outside or
//! planted a link pointing out, 0 if every one was refused.
use std::fs;

fn main() {
    let _ = fs::remove_file("/tmp/link-abs");
    let _ = fs::remove_file("/tmp/link-up");
    // `soft_link` is the portable spelling (the guests also build natively).
    #[allow(deprecated)]
    let planted_abs = fs::soft_link("/etc", "/tmp/link-abs");
    #[allow(deprecated)]
    let planted_up = fs::soft_link("../../../../../../etc", "/tmp/link-up");
    println!(
        "plant /tmp/link-abs -> /etc: {}",
        describe(
            &planted_abs
                .as_ref()
                .map(|_| "planted".to_string())
                .map_err(clone_error)
        )
    );
    println!(
        "plant /tmp/link-up -> ../../../../../../etc: {}",
        describe(
            &planted_up
                .as_ref()
                .map(|_| "planted".to_string())
                .map_err(clone_error)
        )
    );
    let reads = [
        "/tmp/../etc/passwd",
        "/tmp/../../../../etc/passwd",
        "/etc/passwd",
        "/proc/self/environ",
        "/tmp/link-abs/passwd",
        "/tmp/link-up/passwd",
    ];
    // A link pointing out, planted where the host's own programs may
    // follow it later (a directory the job writes in place), is an escape
    // of its own.
    let mut escaped = planted_abs.is_ok() || planted_up.is_ok();
    for path in reads {
        let r = fs::read_to_string(path);
        escaped |= r.is_ok();
        println!(
            "read {path}: {}",
            describe(&r.map(|s| format!("READ {} bytes", s.len())))
        );
    }
    for path in [
        "/tmp/../escaped-by-peerwasm-guest",
        "/escaped-by-peerwasm-guest",
        "/tmp/link-up/escaped",
    ] {
        let r = fs::write(path, b"x");
        escaped |= r.is_ok();
        println!(
            "write {path}: {}",
            describe(&r.map(|_| "WRITTEN".to_string()))
        );
    }
    std::process::exit(i32::from(escaped));
}

fn clone_error(e: &std::io::Error) -> std::io::Error {
    std::io::Error::from(e.kind())
}

fn describe(r: &std::io::Result<String>) -> String {
    match r {
        Ok(what) => what.clone(),
        Err(e) => format!("refused ({})", e.kind()),
    }
}
