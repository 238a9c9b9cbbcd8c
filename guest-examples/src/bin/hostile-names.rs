//! Tries to put more on its scratch disk than its bound by the side doors
//! (mode in its first argument), then says on stderr how far it got and
//! why it stopped:
//! * `renumber`: renumbers a scratch file onto descriptor 1 (stdout) and
//!   writes 1 MiB at a time there (at most 512 MiB);
//! * `symlinks`: makes symbolic links with 4000-byte targets in /tmp (at
//!   most 20,000);
//! * `links`: makes hard links to one file in /tmp (at most 20,000).
//!
//! Built for wasm32-wasip1 (the calls are preview 1's); elsewhere it says
//! so and exits 2.

#[cfg(all(target_os = "wasi", target_env = "p1"))]
mod p1 {
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    unsafe extern "C" {
        pub fn fd_renumber(from: u32, to: u32) -> u16;
        pub fn path_symlink(
            old: *const u8,
            old_len: usize,
            fd: u32,
            new: *const u8,
            new_len: usize,
        ) -> u16;
        pub fn path_link(
            old_fd: u32,
            old_flags: u32,
            old: *const u8,
            old_len: usize,
            new_fd: u32,
            new: *const u8,
            new_len: usize,
        ) -> u16;
    }
}

#[cfg(all(target_os = "wasi", target_env = "p1"))]
fn main() {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd};
    let mode = std::env::args().nth(1).unwrap_or_default();
    let tmp = std::fs::File::open("/tmp").expect("opening /tmp");
    let dir = tmp.as_raw_fd() as u32;
    let said = match mode.as_str() {
        "renumber" => {
            let file = std::fs::File::create("/tmp/out").expect("creating /tmp/out");
            let fd = file.as_raw_fd() as u32;
            std::mem::forget(file);
            // SAFETY: a preview 1 call with two descriptors of ours.
            let errno = unsafe { p1::fd_renumber(fd, 1) };
            assert_eq!(errno, 0, "fd_renumber");
            // SAFETY: descriptor 1 is now the file, and is ours.
            let mut out = unsafe { std::fs::File::from_raw_fd(1) };
            let chunk = vec![7u8; 1 << 20];
            let mut written = 0u64;
            let stopped = loop {
                if written >= 512 << 20 {
                    break "512 MiB written, not refused".to_string();
                }
                match out.write_all(&chunk) {
                    Ok(()) => written += chunk.len() as u64,
                    Err(e) => break e.to_string(),
                }
            };
            format!(
                "wrote {} MiB to descriptor 1, then: {stopped}",
                written >> 20
            )
        }
        "symlinks" | "links" => {
            std::fs::write("/tmp/target", b"x").expect("creating /tmp/target");
            let long = "t".repeat(4000);
            let mut made = 0;
            let stopped = loop {
                if made >= 20_000 {
                    break "20000 made, not refused".to_string();
                }
                let name = format!("n{made}");
                // SAFETY: preview 1 calls with pointers to live buffers.
                let errno = unsafe {
                    if mode == "symlinks" {
                        p1::path_symlink(long.as_ptr(), long.len(), dir, name.as_ptr(), name.len())
                    } else {
                        p1::path_link(
                            dir,
                            0,
                            b"target".as_ptr(),
                            6,
                            dir,
                            name.as_ptr(),
                            name.len(),
                        )
                    }
                };
                if errno != 0 {
                    break format!("errno {errno}");
                }
                made += 1;
            };
            format!("made {made} {mode}, then: {stopped}")
        }
        other => format!("unknown mode {other:?}"),
    };
    eprintln!("{said}");
}

#[cfg(not(all(target_os = "wasi", target_env = "p1")))]
fn main() {
    eprintln!("hostile-names uses WASI preview 1 calls: build it for wasm32-wasip1");
    std::process::exit(2);
}
