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
//! file (by default `/dev/shm/peerwasm-ledger-UID`, `--host-ledger`):
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
//! A worker that cannot open it says so, loudly, and goes on with its own
//! ledger alone.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// How many other workers are live.
    pub workers: usize,
}

/// This worker's place in the host's ledger file.
pub struct HostLedger {
    path: PathBuf,
    file: File,
    pid: u32,
    start: u64,
    instance: u64,
    domain: String,
    /// Processes seen live, and when: each is looked up in `/proc` at most
    /// once per [`LIVENESS_RECHECK`], not on every reservation.
    seen_live: parking_lot::Mutex<std::collections::HashMap<(u32, u64), std::time::Instant>>,
}

/// How long a process seen live is taken to be so: a worker killed with
/// `-9` is dropped from the ledger within this (and the next reservation).
pub const LIVENESS_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl HostLedger {
    /// Opens (or creates) the host's ledger file at `path` for this process,
    /// in memory domain `domain`.
    pub fn open(path: &Path, domain: String) -> std::io::Result<HostLedger> {
        use std::os::unix::fs::OpenOptionsExt;
        let shared = path.parent().is_some_and(|d| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(d).is_ok_and(|m| m.mode() & 0o1000 == 0 && m.mode() & 0o070 != 0)
        });
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(if shared { 0o660 } else { 0o600 })
            .open(path)?;
        let pid = std::process::id();
        let start = start_time(pid).ok_or_else(|| std::io::Error::other("cannot read this process's start time"))?;
        Ok(HostLedger {
            path: path.to_path_buf(),
            file,
            pid,
            start,
            instance: rand::random(),
            domain,
            seen_live: Default::default(),
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
    pub fn transact<T>(&self, addr: &str, decide: impl FnOnce(Others) -> (T, Option<(u64, u64)>)) -> std::io::Result<T> {
        let _lock = Flock::exclusive(&self.file)?;
        let all = self.read_records()?;
        let before = all.len();
        let me = |r: &Record| self.is_mine(r);
        let mine = all.iter().find(|r| me(r)).cloned();
        let mut records: Vec<Record> = all.into_iter().filter(|r| !me(r) && self.is_live(r)).collect();
        let others = Others {
            taken_in_domain: records.iter().filter(|r| r.domain == self.domain).map(|r| r.taken).sum(),
            untouched: records.iter().map(|r| r.untouched).sum(),
            workers: records.len(),
        };
        let (answer, update) = decide(others);
        let record = match (update, mine) {
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

    /// Takes this worker's record out (it is stopping).
    pub fn leave(&self) {
        let result = (|| -> std::io::Result<()> {
            let _lock = Flock::exclusive(&self.file)?;
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
        if seen.get(&key).is_some_and(|at| at.elapsed() < LIVENESS_RECHECK) {
            return true;
        }
        let live = start_time(r.pid) == Some(r.start);
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
    fn exclusive(file: &'f File) -> std::io::Result<Flock<'f>> {
        // SAFETY: flock(2) on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Flock(file))
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

/// The default path of the host's ledger: in `/dev/shm` (memory, gone at
/// reboot, like the reservations it records), per user.
pub fn default_path() -> PathBuf {
    // SAFETY: geteuid(2) cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    dir.join(format!("peerwasm-ledger-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_worker_sees_the_live_others_and_drops_the_dead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger");
        let ledger = HostLedger::open(&path, "host".into()).unwrap();
        ledger.transact("me", |_| ((), Some((GIB, GIB)))).unwrap();
        // Another worker stands as process 1 (live, its real start time);
        // one in another cgroup; and one whose process is gone.
        let other = |pid: u32, start: u64, domain: &str, taken: u64| Record {
            pid,
            start,
            instance: 0,
            domain: domain.into(),
            taken,
            untouched: taken / 2,
            addr: format!("w{pid}"),
        };
        let init = start_time(1).unwrap();
        let mut records = ledger.read_records().unwrap();
        records.extend([other(1, init, "host", 2 * GIB), other(1, init, "/slurm/job7", 4 * GIB), other(u32::MAX - 1, 7, "host", 8 * GIB)]);
        ledger.write_records(&records).unwrap();
        let seen = ledger.transact("me", |o| (o, None)).unwrap();
        assert_eq!(seen, Others { taken_in_domain: 2 * GIB, untouched: 3 * GIB, workers: 2 });
        assert_eq!(ledger.read_records().unwrap().len(), 3, "the dead record is gone, ours is kept");
        // Leaving takes our record out, and only ours.
        drop(ledger);
        let again = HostLedger::open(&path, "host".into()).unwrap();
        assert_eq!(again.read_records().unwrap().iter().filter(|r| r.addr == "me").count(), 0);
        // Junk in the file is not trusted, and not fatal.
        std::fs::write(&path, b"not a ledger").unwrap();
        assert_eq!(again.transact("me", |o| (o, Some((1, 1)))).unwrap(), Others::default());
    }
}
