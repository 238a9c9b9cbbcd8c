//! One ledger per host: every peerwasm worker on a machine agrees on its
//! memory (smartmem, whole).
//!
//! A worker's own [`Ledger`](super::ledger::Ledger) counts its reservations
//! as taken before its jobs touch them. Two workers on one host (two users
//! lending shares of a workstation, two Slurm allocations on one node, two
//! workers in one container) each saw only the memory the *other* had
//! already touched: each accepted a large job, and together they
//! over-committed the host — FieldTrip's smartmem failure, across
//! processes. So each worker also keeps its record in one small shared
//! file (by default `ledger` in this user's private runtime dir,
//! `/dev/shm/peerwasm-UID/`; `--host-ledger`):
//!
//! * what it has reserved and holds for its jobs, and how much of its
//!   reservations its jobs have not touched yet;
//! * its *memory domain*: the cgroup whose limit binds it, or the host.
//!
//! A reservation is decided under the file's lock (`flock`), reading every
//! other worker's record: the reservations and holds of all workers of one
//! domain never exceed the domain's limit (the cgroup's, or physical memory
//! less `--reserve`), and memory any other worker has reserved but not
//! touched is subtracted from what the host has available, as a worker's
//! own is. Records of workers that are gone (killed with `-9`) are dropped
//! by whoever next reads the file, within [`LIVENESS_RECHECK`]: a record
//! names its process and that process's start time, so a reused pid is not
//! mistaken for it.
//!
//! What it costs (`peerwasm-benches hostledger`): a reservation and its
//! release take ~20 µs with the file (a lock, a read and a write of a few
//! hundred bytes, twice) against 0.1 µs alone — nothing beside a job's
//! milliseconds.
//!
//! Who may share the file is who may open it: the same user by default
//! (mode 0600); a lab whose workers run as different users gives them one
//! path in a directory of a common group (the file is then made 0660).
//! The file decides how much memory every worker may lend, so nobody else
//! may write it: it is opened without following a link and refused unless
//! it is this user's and private (or the lab group's, in a directory others
//! cannot write) — see [`open_private_file`](crate::private_path::open_private_file).
//! A worker that cannot open it says so, loudly, and goes on with its own
//! ledger alone.
//!
//! What is in it is checked too: a record is believed only from a live
//! process that holds the file open (a worker; one of another user's, in a
//! lab's group file, by its pid and start time alone) and claiming no more
//! than the host has; others are ignored and said once. The lock is taken
//! without waiting for ever ([`LOCK_PATIENCE`]): a worker whose file is held
//! locked by a stuck process decides alone, loudly, and goes on answering.
//! Each worker writes its own record from what it knows, not from the file,
//! so a file emptied under running workers is whole again at their next
//! reservation.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::private_path::{Sharing, open_private_file};

/// The file's first bytes, and its layout's version.
const MAGIC: &[u8; 8] = b"pwledg01";

/// The most records the file keeps: more workers than this on one host
/// are not seen by each other (said in the log).
pub const MAX_RECORDS: usize = 256;

/// One worker's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its process.
    pub pid: u32,
    /// Its process's start time (clock ticks after boot, `/proc/PID/stat`).
    pub start: u64,
    /// Which ledger of that process (a random number): one process may
    /// hold more than one (the tests do).
    pub instance: u64,
    /// Its memory domain: the cgroup whose limit binds it, or `host`.
    pub domain: String,
    /// Bytes reserved for its jobs and held for their output and results.
    pub taken: u64,
    /// Of its reservations, bytes its jobs have not touched yet.
    pub untouched: u64,
    /// Its address, for the log and `peerwasm peers`.
    pub addr: String,
}

/// What the other live workers of the host have, as one worker sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    /// Σ taken by the workers of the same domain.
    pub taken_in_domain: u64,
    /// Σ untouched by every other worker of the host.
    pub untouched: u64,
    /// Σ untouched by the workers of the same domain.
    pub untouched_in_domain: u64,
    /// How many other workers are live.
    pub workers: usize,
}

/// This worker's place in the host's ledger file.
pub struct HostLedger {
    path: PathBuf,
    file: File,
    /// The file's identity (device, inode): a process holding it open is a
    /// worker of this ledger.
    identity: (u64, u64),
    pid: u32,
    start: u64,
    instance: u64,
    domain: String,
    /// The most any record may claim: the host's physical memory.
    max_bytes: u64,
    /// Processes seen to be workers of this file, and when: each is looked
    /// up in `/proc` at most once per [`LIVENESS_RECHECK`], not on every
    /// reservation.
    seen_live: parking_lot::Mutex<std::collections::HashMap<(u32, u64), std::time::Instant>>,
    /// Records already said to be ignored (once each).
    said: parking_lot::Mutex<std::collections::HashSet<(u32, u64, u64)>>,
    /// This worker's own figures as last written: its record is written
    /// from these, never copied from the file.
    mine: parking_lot::Mutex<Option<(u64, u64)>>,
    /// After the lock could not be had in time: until when the file is not
    /// tried again, and when that was last said.
    skip_until: parking_lot::Mutex<Option<std::time::Instant>>,
    said_locked: parking_lot::Mutex<Option<std::time::Instant>>,
}

/// How long a process seen live is taken to be so: a worker killed with
/// `-9` is dropped from the ledger within this (and the next reservation).
pub const LIVENESS_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a reservation waits for the file's lock (an honest holder
/// keeps it ~20 µs). Past it the worker decides alone with the others as
/// last read, says so, and leaves the file alone for [`LOCK_BACKOFF`]: a
/// process that holds the lock (stuck, or hostile) never stops the
/// worker's admission, nor its HTTP, which shares its threads.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(50);

/// See [`LOCK_PATIENCE`].
pub const LOCK_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

impl HostLedger {
    /// Opens (or creates) the host's ledger file at `path` for this process,
    /// in memory domain `domain`, on a host of `max_bytes` of memory. The
    /// file must be this user's alone, or (in a directory of a group, not
    /// writable by others) that group's; a link is refused.
    pub fn open(path: &Path, domain: String, max_bytes: u64) -> anyhow::Result<HostLedger> {
        use std::os::unix::fs::MetadataExt;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // A lab's group directory: its group may write there, others not.
        let group =
            std::fs::metadata(dir).is_ok_and(|m| m.mode() & 0o020 != 0 && m.mode() & 0o002 == 0);
        let sharing = if group {
            Sharing::Group
        } else {
            Sharing::Private
        };
        let file = open_private_file(path, "the host's ledger", true, sharing)?;
        let meta = file.metadata()?;
        let pid = std::process::id();
        let start = start_time(pid)
            .ok_or_else(|| anyhow::anyhow!("cannot read this process's start time"))?;
        Ok(HostLedger {
            path: path.to_path_buf(),
            file,
            identity: (meta.dev(), meta.ino()),
            pid,
            start,
            instance: rand::random(),
            domain,
            max_bytes,
            seen_live: Default::default(),
            said: Default::default(),
            mine: Default::default(),
            skip_until: Default::default(),
            said_locked: Default::default(),
        })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This worker's domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Under the file's lock: reads the live records of the other workers,
    /// lets `decide` choose from them (returning what to write as this
    /// worker's `taken` and `untouched`, or `None` to leave its record as
    /// it is), writes the file back and returns what `decide` returned.
    pub fn transact<T>(
        &self,
        addr: &str,
        decide: impl FnOnce(Others) -> (T, Option<(u64, u64)>),
    ) -> std::io::Result<T> {
        let _lock = self.lock()?;
        let all = self.read_records()?;
        let before = all.len();
        let me = |r: &Record| self.is_mine(r);
        let mine = all.iter().find(|r| me(r)).cloned();
        let mut records: Vec<Record> = all
            .into_iter()
            .filter(|r| !me(r) && self.believed(r))
            .collect();
        let others = Others {
            taken_in_domain: records
                .iter()
                .filter(|r| r.domain == self.domain)
                .map(|r| r.taken)
                .sum(),
            untouched: records.iter().map(|r| r.untouched).sum(),
            untouched_in_domain: records
                .iter()
                .filter(|r| r.domain == self.domain)
                .map(|r| r.untouched)
                .sum(),
            workers: records.len(),
        };
        let (answer, update) = decide(others);
        let mut last = self.mine.lock();
        if update.is_some() {
            *last = update;
        }
        // Written from what this worker knows: a record of ours missing
        // from the file (emptied, rewritten) is put back.
        let record = match (*last, mine) {
            (Some((taken, untouched)), _) => Some(Record {
                pid: self.pid,
                start: self.start,
                instance: self.instance,
                domain: self.domain.clone(),
                taken,
                untouched,
                addr: addr.to_string(),
            }),
            (None, mine) => mine,
        };
        if let Some(r) = record {
            records.push(r);
        }
        if records.len() > MAX_RECORDS {
            tracing::warn!(path = %self.path.display(), "more than {MAX_RECORDS} workers on this host: the oldest records are left out");
            let excess = records.len() - MAX_RECORDS;
            records.drain(..excess);
        }
        if update.is_some() || records.len() != before {
            self.write_records(&records)?;
        }
        Ok(answer)
    }

    /// The file's lock, waited for at most [`LOCK_PATIENCE`]; see there.
    fn lock(&self) -> std::io::Result<Flock<'_>> {
        let now = std::time::Instant::now();
        if self.skip_until.lock().is_some_and(|until| now < until) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "the host's ledger was held locked by another process",
            ));
        }
        match Flock::exclusive_within(&self.file, LOCK_PATIENCE) {
            Ok(lock) => Ok(lock),
            Err(e) => {
                *self.skip_until.lock() = Some(now + LOCK_BACKOFF);
                let mut said = self.said_locked.lock();
                if said.is_none_or(|at| at.elapsed() > std::time::Duration::from_secs(30)) {
                    *said = Some(now);
                    tracing::error!(
                        path = %self.path.display(),
                        "the host's ledger has been locked by another process for over {LOCK_PATIENCE:?}: this worker \
                         decides alone (with the other workers as last read) until it can have the lock again"
                    );
                }
                Err(e)
            }
        }
    }

    /// Whether `r` is believed: a live worker of this file (its process, by
    /// pid and start time, holds the file open), claiming no more than the
    /// host has. Another is ignored and said once.
    fn believed(&self, r: &Record) -> bool {
        let sane = r.taken <= self.max_bytes && r.untouched <= r.taken;
        if sane && self.is_live(r) {
            return true;
        }
        if sane && start_time(r.pid) != Some(r.start) {
            return false; // a worker that is gone: dropped without a word
        }
        if self.said.lock().insert((r.pid, r.start, r.instance)) {
            let why = if sane {
                "its process does not hold the ledger open: it is not a worker".to_string()
            } else {
                format!(
                    "it claims {} taken, {} untouched, on a host of {}",
                    r.taken, r.untouched, self.max_bytes
                )
            };
            tracing::warn!(path = %self.path.display(), pid = r.pid, addr = %r.addr, "ignored a record in the host's ledger: {why}");
        }
        false
    }

    /// Takes this worker's record out (it is stopping).
    pub fn leave(&self) {
        let result = (|| -> std::io::Result<()> {
            let _lock = Flock::exclusive_within(&self.file, LOCK_PATIENCE)?;
            let mut records = self.read_records()?;
            records.retain(|r| !self.is_mine(r));
            self.write_records(&records)
        })();
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), "cannot take this worker out of the host's ledger: {e}");
        }
    }

    /// Whether `r`'s process still runs (the same process: its start time
    /// tells a reused pid apart).
    fn is_live(&self, r: &Record) -> bool {
        let key = (r.pid, r.start);
        let mut seen = self.seen_live.lock();
        if seen
            .get(&key)
            .is_some_and(|at| at.elapsed() < LIVENESS_RECHECK)
        {
            return true;
        }
        let live = start_time(r.pid) == Some(r.start) && holds_open(r.pid, self.identity);
        if live {
            seen.insert(key, std::time::Instant::now());
        } else {
            seen.remove(&key);
        }
        seen.retain(|_, at| at.elapsed() < LIVENESS_RECHECK);
        live
    }

    fn is_mine(&self, r: &Record) -> bool {
        (r.pid, r.start, r.instance) == (self.pid, self.start, self.instance)
    }

    fn read_records(&self) -> std::io::Result<Vec<Record>> {
        let mut bytes = Vec::new();
        (&self.file).seek(SeekFrom::Start(0))?;
        (&self.file).read_to_end(&mut bytes)?;
        match bytes.strip_prefix(MAGIC.as_slice()) {
            Some(body) => Ok(postcard::from_bytes(body).unwrap_or_else(|e| {
                tracing::warn!(path = %self.path.display(), "the host's ledger cannot be read ({e}): started afresh");
                Vec::new()
            })),
            None if bytes.is_empty() => Ok(Vec::new()),
            None => {
                tracing::warn!(path = %self.path.display(), "the host's ledger is not peerwasm's: started afresh");
                Ok(Vec::new())
            }
        }
    }

    fn write_records(&self, records: &[Record]) -> std::io::Result<()> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(postcard::to_allocvec(records).map_err(std::io::Error::other)?);
        (&self.file).seek(SeekFrom::Start(0))?;
        (&self.file).write_all(&bytes)?;
        self.file.set_len(bytes.len() as u64)
    }
}

impl Drop for HostLedger {
    fn drop(&mut self) {
        self.leave();
    }
}

/// An exclusive `flock` on a file, released when dropped.
struct Flock<'f>(&'f File);

impl<'f> Flock<'f> {
    /// The lock, tried without blocking until `patience` has passed.
    fn exclusive_within(
        file: &'f File,
        patience: std::time::Duration,
    ) -> std::io::Result<Flock<'f>> {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(50);
        loop {
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Flock(file));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e);
            }
            if start.elapsed() >= patience {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!("locked by another process for over {patience:?}"),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: flock(2) on a descriptor we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// When process `pid` started (field 22 of `/proc/PID/stat`), if it lives.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` holds the file `identity` (device, inode) open.
/// Another user's process (a lab's group file) cannot be looked into: its
/// pid and start time stand for it.
fn holds_open(pid: u32, identity: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds,
        Err(e) => return e.kind() == std::io::ErrorKind::PermissionDenied,
    };
    fds.flatten()
        .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == identity))
}

/// The default path of the host's ledger: `ledger` in this user's private
/// runtime dir (`/dev/shm/peerwasm-UID`: memory, gone at reboot, like the
/// reservations it records), made if missing. Where that dir cannot be had
/// (another user made it), the path it would have: opening it then fails,
/// and the worker says so and decides alone.
pub fn default_path() -> PathBuf {
    match crate::private_path::user_runtime_dir() {
        Ok(dir) => dir.join("ledger"),
        Err(e) => {
            tracing::error!("{e:#}");
            crate::private_path::user_runtime_path().join("ledger")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A process standing for another worker: it holds `path` open.
    fn holder(path: &Path) -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("60")
            .stdin(File::open(path).unwrap())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_worker_sees_the_live_others_and_drops_the_dead_and_the_unbelievable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger");
        let ledger = HostLedger::open(&path, "host".into(), 64 * GIB).unwrap();
        ledger.transact("me", |_| ((), Some((GIB, GIB)))).unwrap();
        let mut other_worker = holder(&path);
        let pid = other_worker.id();
        let started = start_time(pid).unwrap();
        let other = |pid: u32, start: u64, domain: &str, taken: u64| Record {
            pid,
            start,
            instance: taken,
            domain: domain.into(),
            taken,
            untouched: taken / 2,
            addr: format!("w{pid}"),
        };
        // A worker in this domain and one in another cgroup (the same
        // process holding the file stands for both); one whose process is
        // gone; process 1, live but not holding the file (not a worker);
        // and one claiming more than the host has.
        let init = start_time(1).unwrap();
        let mut records = ledger.read_records().unwrap();
        records.extend([
            other(pid, started, "host", 2 * GIB),
            other(pid, started, "/slurm/job7", 4 * GIB),
            other(u32::MAX - 1, 7, "host", 8 * GIB),
            other(1, init, "host", 16 * GIB),
            other(pid, started, "host", 1 << 50),
        ]);
        ledger.write_records(&records).unwrap();
        let seen = ledger.transact("me", |o| (o, None)).unwrap();
        assert_eq!(
            seen,
            Others {
                taken_in_domain: 2 * GIB,
                untouched: 3 * GIB,
                untouched_in_domain: GIB,
                workers: 2
            }
        );
        assert_eq!(
            ledger.read_records().unwrap().len(),
            3,
            "the dead and the unbelievable are gone, ours is kept"
        );

        // Emptied under us: our record is back at the next transaction.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        ledger.transact("me", |o| (o, None)).unwrap();
        let mine: Vec<Record> = ledger
            .read_records()
            .unwrap()
            .into_iter()
            .filter(|r| r.addr == "me")
            .collect();
        assert_eq!(
            (mine.len(), mine[0].taken),
            (1, GIB),
            "written from what this worker knows"
        );

        // A lock held elsewhere costs a reservation at most the patience.
        let held = File::open(&path).unwrap();
        // SAFETY: flock(2) on a descriptor we own (another open file
        // description: it contends with the ledger's own).
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
        let t = std::time::Instant::now();
        let e = ledger.transact("me", |o| (o, None)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(t.elapsed() < LOCK_PATIENCE * 20, "waited {:?}", t.elapsed());
        let t = std::time::Instant::now();
        assert!(ledger.transact("me", |o| (o, None)).is_err());
        assert!(
            t.elapsed() < LOCK_PATIENCE,
            "backs off: not tried again at once"
        );
        drop(held);

        // Leaving takes our record out, and only ours.
        drop(ledger);
        let again = HostLedger::open(&path, "host".into(), 64 * GIB).unwrap();
        assert_eq!(
            again
                .read_records()
                .unwrap()
                .iter()
                .filter(|r| r.addr == "me")
                .count(),
            0
        );
        // Junk in the file is not trusted, and not fatal.
        std::fs::write(&path, b"not a ledger").unwrap();
        assert_eq!(
            again.transact("me", |o| (o, Some((1, 1)))).unwrap(),
            Others::default()
        );
        let _ = other_worker.kill();
        let _ = other_worker.wait();
    }

    #[test]
    fn a_planted_link_or_a_file_open_to_others_is_refused_and_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let link = dir.path().join("ledger");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = HostLedger::open(&link, "host".into(), GIB).err().unwrap();
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let open = dir.path().join("open");
        std::fs::write(&open, b"").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = HostLedger::open(&open, "host".into(), GIB).err().unwrap();
        assert!(format!("{e:#}").contains("open to others"), "{e:#}");
        std::fs::hard_link(&target, dir.path().join("second-name")).unwrap();
        let e = HostLedger::open(&target, "host".into(), GIB).err().unwrap();
        assert!(format!("{e:#}").contains("2 names"), "{e:#}");
    }
}
