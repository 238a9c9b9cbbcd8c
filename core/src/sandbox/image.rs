//! A snapshot's image: an interpreter's linear memory as a sealed
//! in-memory file (a memfd), its all-zero pages left as holes (they read as
//! zeros and take nothing), which warm jobs map copy-on-write. Made from a
//! memory just snapshotted ([`of_memory`]) or from a snapshot kept on disk
//! ([`of_file`]).
//!
//! Why the file is copied straight into the memfd rather than read into a
//! buffer first: a fresh process's first Python item waits for this, in
//! each of its slot processes at once. Reading CPython's 124 MiB snapshot
//! (92 MiB of data) whole into a `Vec` faulted in and zeroed 124 MiB, read
//! the holes as zeros, scanned them, copied the rest again and unmapped it
//! all; here only the file's data extents are read (`SEEK_DATA`), through
//! one 1 MiB buffer.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

/// A wasm page.
pub(super) const WASM_PAGE: usize = 64 << 10;

/// The unit zero pages are found in (and left as holes).
const CHUNK: usize = 64 << 10;

/// How much of a kept file is read at a time.
const READ: usize = 1 << 20;

/// `memory` as a sealed memfd of its length.
pub(super) fn of_memory(memory: &[u8]) -> std::io::Result<(OwnedFd, usize)> {
    sealed(memory.len(), |image| write_nonzero(image, memory, 0))
}

/// The first `len` bytes of `file` (a snapshot kept on disk, its zero pages
/// holes or zeros) as a sealed memfd of that length. Only the file's data
/// extents are read where the filesystem says where they are; the whole
/// file otherwise.
pub(super) fn of_file(file: &File, len: usize) -> std::io::Result<(OwnedFd, usize)> {
    sealed(len, |image| {
        let mut buf = vec![0u8; READ];
        let mut at = 0usize;
        while at < len {
            let Some((start, end)) = next_extent(file, at, len)? else {
                break;
            };
            let mut pos = start;
            while pos < end {
                let want = READ.min(end - pos);
                let got = file.read_at(&mut buf[..want], pos as u64)?;
                if got == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the snapshot file ended early",
                    ));
                }
                write_nonzero(image, &buf[..got], pos)?;
                pos += got;
            }
            at = end;
        }
        // A file shortened while it was read (its end read as holes). It
        // may go on past `len` (a kept snapshot's trailer).
        if file.metadata()?.len() < len as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the snapshot file changed length while it was read",
            ));
        }
        Ok(())
    })
}

/// The next stretch of `file` at or after `at` (below `len`) that holds
/// data: `(start, end)`; `None` when only holes are left. Where the
/// filesystem cannot say (`SEEK_DATA` unsupported), all of the rest.
fn next_extent(file: &File, at: usize, len: usize) -> std::io::Result<Option<(usize, usize)>> {
    let fd = file.as_raw_fd();
    // SAFETY: lseek on an open descriptor; only its offset changes, and
    // every read here is positioned (`read_at`).
    let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
    if start < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            // No data at or after `at`.
            Some(libc::ENXIO) => Ok(None),
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some((at, len))),
            _ => Err(e),
        };
    }
    let start = (start as usize).min(len);
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start as libc::off_t, libc::SEEK_HOLE) };
    let end = if end < 0 {
        len
    } else {
        (end as usize).min(len)
    };
    Ok((start < end).then_some((start, end)))
}

/// Writes the chunks of `bytes` (which begin at `offset`) that are not all
/// zero into `image` at their place.
fn write_nonzero(image: &File, bytes: &[u8], offset: usize) -> std::io::Result<()> {
    // Chunks aligned to the image, so a hole is a whole chunk.
    let mut pos = 0;
    while pos < bytes.len() {
        let next = ((offset + pos) / CHUNK + 1) * CHUNK - offset;
        let chunk = &bytes[pos..next.min(bytes.len())];
        if !all_zero(chunk) {
            image.write_all_at(chunk, (offset + pos) as u64)?;
        }
        pos += chunk.len();
    }
    Ok(())
}

/// A memfd of `len` bytes, filled by `fill`, then sealed: no one, this
/// process included, can change the image that jobs map.
fn sealed(
    len: usize,
    fill: impl FnOnce(&File) -> std::io::Result<()>,
) -> std::io::Result<(OwnedFd, usize)> {
    // SAFETY: a valid C string; the descriptor is owned at once.
    let fd = unsafe {
        libc::memfd_create(
            c"peerwasm-snapshot".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len as u64)?;
    fill(&file)?;
    // SAFETY: fcntl on an open descriptor.
    let sealed = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    if sealed < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((OwnedFd::from(file), len))
}

/// Whether `bytes` are all zero (a page left as a hole).
pub(super) fn all_zero(bytes: &[u8]) -> bool {
    // SAFETY: every bit pattern is a valid u64.
    let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six pages: data in the first, the fourth (one byte at its end) and
    /// the last; the others zero.
    fn memory() -> Vec<u8> {
        let mut m = vec![0u8; 6 * WASM_PAGE];
        m[10] = 1;
        m[4 * WASM_PAGE - 1] = 2;
        m[6 * WASM_PAGE - 3] = 3;
        m
    }

    fn read_back(fd: OwnedFd, len: usize) -> Vec<u8> {
        let file = File::from(fd);
        let mut out = vec![0u8; len];
        file.read_exact_at(&mut out, 0).unwrap();
        out
    }

    /// Blocks the memfd holds, in 512-byte units.
    fn blocks(fd: &OwnedFd) -> u64 {
        use std::os::unix::fs::MetadataExt;
        File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .blocks()
    }

    #[test]
    fn an_image_reads_back_as_the_memory_and_holds_only_its_data_pages() {
        let m = memory();
        let (fd, len) = of_memory(&m).unwrap();
        assert_eq!(len, m.len());
        let held = blocks(&fd) * 512;
        assert!(
            held <= 3 * CHUNK as u64,
            "zero pages were written: {held} bytes held"
        );
        assert_eq!(read_back(fd, len), m);
    }

    #[test]
    fn an_image_of_a_kept_file_is_the_same_whether_its_zeros_are_holes_or_written() {
        let m = memory();
        let dir = tempfile::tempdir().unwrap();
        // As `SnapshotDir::save` writes it: the zero pages as holes.
        let sparse = dir.path().join("sparse");
        let f = File::create(&sparse).unwrap();
        f.set_len(m.len() as u64).unwrap();
        for (i, chunk) in m.chunks(CHUNK).enumerate() {
            if !all_zero(chunk) {
                f.write_all_at(chunk, (i * CHUNK) as u64).unwrap();
            }
        }
        // And written out whole, zeros and all.
        let dense = dir.path().join("dense");
        std::fs::write(&dense, &m).unwrap();
        for path in [sparse, dense] {
            let (fd, len) = of_file(&File::open(&path).unwrap(), m.len()).unwrap();
            let held = blocks(&fd) * 512;
            assert!(
                held <= 3 * CHUNK as u64,
                "{path:?}: zeros copied: {held} bytes"
            );
            assert_eq!(read_back(fd, len), m, "{path:?}");
        }
    }

    #[test]
    fn a_kept_file_shorter_than_said_is_an_error_not_an_image_padded_with_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, vec![7u8; WASM_PAGE]).unwrap();
        let file = File::open(&path).unwrap();
        assert!(of_file(&file, 2 * WASM_PAGE).is_err());
        assert!(of_file(&file, WASM_PAGE).is_ok());
    }
}
