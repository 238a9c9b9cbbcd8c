//! The worker's durable state: one SQLite database (WAL) in `--state-dir`,
//! holding what must outlive the process — submissions (their job, inputs
//! and results, `submissions.rs`) and the history of the jobs this worker
//! ran (`history.rs`). Module bytes of submissions sit beside it, one file
//! per hash under `modules/`.
//!
//! Why SQLite: transactions make "the inputs are stored" and "the result
//! is stored" single facts that survive `kill -9` at any moment, WAL lets
//! readers (`peerwasm results`) read while the map writes, and a bundled
//! build needs nothing on the host.
//!
//! All writes go through one writer thread, which commits everything that
//! queued up while the previous commit was being synced (group commit): a
//! map that finishes thousands of jobs a second pays for one `fsync` per
//! group, not per result. Writes nobody waits for (history rows, results)
//! wait up to [`LAZY_COMMIT_DELAY`] for company, so a busy worker syncs a
//! few times a second. Each write runs in a savepoint of its own, so
//! one failing write does not take the others of its group with it.
//! `synchronous = FULL`: a committed transaction survives a power cut too.
//!
//! Opening refuses, with a message that says what to do and deleting
//! nothing: a directory that holds other things and no `state.db`; a file
//! that is not SQLite, or is damaged (truncated); a SQLite database of
//! another program; one written by a newer peerwasm; a state dir another
//! worker has open (a lock file, `flock`). That is `open.rs`'s; this file
//! is the database once open: its writer thread and readers.

mod open;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use anyhow::{Context, bail};
use parking_lot::Mutex;
use rusqlite::Connection;
use tokio::sync::{oneshot, watch};

pub use open::DB_FILE;
#[cfg(test)]
use open::SCHEMA;
use open::{lock_dir, open_checked, prepare_dir, private_file};

/// The most writes committed in one transaction.
const MAX_GROUP: usize = 4096;

/// How long writes nobody waits for ([`StateDb::write_later`]) may wait for
/// company before they are committed; see `gather`. What a crash can lose
/// of them: a job's history row, or a result whose job then runs again.
pub const LAZY_COMMIT_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

type WriteFn = Box<dyn FnOnce(&Connection) -> rusqlite::Result<()> + Send>;

struct Write {
    f: WriteFn,
    done: Option<oneshot::Sender<Result<(), String>>>,
    /// Someone waits for it now: commit without waiting for company.
    urgent: bool,
}

/// Whether a write queued by [`StateDb::write_soon`] was committed: `Ok`,
/// or why not (the write or its group's commit failed, e.g. the disk is
/// full). A dropped sender means the database was closed first.
pub type Committed = oneshot::Receiver<Result<(), String>>;

/// The open state database: one writer thread, one reading connection.
pub struct StateDb {
    dir: PathBuf,
    writes: Mutex<Option<mpsc::Sender<Write>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The writer, to wake when a write someone waits for is queued (see
    /// `gather`).
    writer_thread: std::thread::Thread,
    reader: Arc<Mutex<Connection>>,
    committed: watch::Receiver<u64>,
    /// Held for as long as the database is open: another worker on the
    /// same dir is refused.
    _lock: File,
    /// A state dir made for this run only (no `--state-dir`, port 0).
    _temp: Option<tempfile::TempDir>,
}

impl StateDb {
    /// Opens (or creates) the state database in `dir`; see the module docs
    /// for what is refused.
    pub fn open(dir: &Path) -> anyhow::Result<StateDb> {
        StateDb::open_inner(dir, None)
    }

    /// A state database in a new temporary directory (under `parent`, else
    /// the system's), removed when it is dropped: for a worker whose state
    /// need not outlive it.
    pub fn temporary(parent: Option<&Path>) -> anyhow::Result<StateDb> {
        const PREFIX: &str = "peerwasm-state-";
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        // Those of workers killed here: each holds its `lock` while alive
        // (`lock_dir`), and a dead one's goes (`peerwasm::leftovers`).
        crate::leftovers::sweep(&parent, PREFIX, "lock", crate::leftovers::GRACE);
        let temp = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir_in(&parent)
            .context("cannot make a temporary state dir")?;
        let path = temp.path().to_path_buf();
        StateDb::open_inner(&path, Some(temp))
    }

    fn open_inner(dir: &Path, temp: Option<tempfile::TempDir>) -> anyhow::Result<StateDb> {
        let db_path = dir.join(DB_FILE);
        prepare_dir(dir, &db_path)?;
        let lock = lock_dir(dir)?;
        // SQLite gives its -wal and -shm files the database's mode: made
        // 0600 first, all three are the worker user's alone.
        for suffix in ["", "-wal", "-shm"] {
            private_file(&dir.join(format!("{DB_FILE}{suffix}")), false)?;
        }
        private_file(&db_path, true)?;
        let conn = open_checked(&db_path)?;
        let reader =
            Connection::open_with_flags(&db_path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .with_context(|| format!("cannot open {} for reading", db_path.display()))?;
        let (tx, rx) = mpsc::channel();
        let (committed_tx, committed) = watch::channel(0);
        let writer = std::thread::Builder::new()
            .name("peerwasm-statedb".into())
            .spawn(move || write_loop(conn, rx, committed_tx))
            .context("cannot start the state database's writer")?;
        Ok(StateDb {
            dir: dir.to_path_buf(),
            writes: Mutex::new(Some(tx)),
            writer_thread: writer.thread().clone(),
            writer: Mutex::new(Some(writer)),
            reader: Arc::new(Mutex::new(reader)),
            committed,
            _lock: lock,
            _temp: temp,
        })
    }

    /// The state dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where a kept module's bytes are.
    pub fn module_path(&self, hash: &crate::proto::ModuleHash) -> PathBuf {
        self.dir
            .join("modules")
            .join(format!("{}.wasm", hash.to_hex()))
    }

    /// Keeps a module's bytes so that they are there after a crash: a
    /// temporary file, synced, renamed, and its directory synced. Nothing
    /// if it is kept already. Blocking.
    pub fn keep_module(
        &self,
        hash: &crate::proto::ModuleHash,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        let path = self.module_path(hash);
        if path.exists() {
            return Ok(());
        }
        let dir = path.parent().expect("a module path has a parent");
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| e.error)?;
        File::open(dir)?.sync_all()
    }

    fn send(&self, write: Write) -> bool {
        let writes = self.writes.lock();
        writes.as_ref().is_some_and(|tx| tx.send(write).is_ok())
    }

    /// Runs `f` in a transaction and returns once it is committed (synced).
    pub async fn write(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (done, wait) = oneshot::channel();
        if !self.send(Write {
            f: Box::new(f),
            done: Some(done),
            urgent: true,
        }) {
            bail!("the state database is closed");
        }
        self.writer_thread.unpark();
        match wait.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => bail!("the state database refused a write: {e}"),
            Err(_) => bail!("the state database's writer stopped"),
        }
    }

    /// Queues `f` to be committed with the next group, without waiting.
    /// Writes are committed in the order they are queued; a failure is
    /// logged.
    pub fn write_later(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static,
    ) {
        if !self.send(Write {
            f: Box::new(f),
            done: None,
            urgent: false,
        }) {
            tracing::warn!("a write to the closed state database was dropped");
        }
    }

    /// Like [`write_later`](Self::write_later) (committed with the next
    /// group, which waits for company), but the caller learns whether it
    /// was committed: for writes that must not be lost in silence.
    pub fn write_soon(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> Committed {
        let (done, committed) = oneshot::channel();
        // A closed database drops `done`: the receiver says so.
        self.send(Write {
            f: Box::new(f),
            done: Some(done),
            urgent: false,
        });
        committed
    }

    /// Returns once everything queued before it is committed.
    pub async fn sync(&self) -> anyhow::Result<()> {
        self.write(|_| Ok(())).await
    }

    /// Runs `f` on the reading connection, on a blocking thread. It sees
    /// what was committed when it starts.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader.lock();
            f(&conn)
        })
        .await
        .context("a state database read failed")?
        .context("reading the state database")
    }

    /// [`read`](Self::read) on the calling thread, which it blocks.
    pub fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> anyhow::Result<T> {
        let conn = self.reader.lock();
        f(&conn).context("reading the state database")
    }

    /// Changes (to a count of commits) each time a group is committed.
    pub fn committed(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    /// Commits what is queued, then stops the writer. Later writes are
    /// dropped (and logged).
    pub fn close(&self) {
        self.writes.lock().take();
        self.writer_thread.unpark();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for StateDb {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer thread: group commits until every sender is gone.
fn write_loop(mut conn: Connection, rx: mpsc::Receiver<Write>, committed: watch::Sender<u64>) {
    while let Ok(first) = rx.recv() {
        let group = gather(first, &rx);
        let mut outcomes = Vec::with_capacity(group.len());
        let committed_ok = (|| -> rusqlite::Result<()> {
            let mut tx = conn.transaction()?;
            for w in group {
                let sp = tx.savepoint()?;
                let r = (w.f)(&sp);
                if r.is_ok() {
                    sp.commit()?;
                } // else dropped: rolled back
                outcomes.push((w.done, r.map_err(|e| e.to_string())));
            }
            tx.commit()
        })();
        if let Err(e) = &committed_ok {
            tracing::error!("the state database could not commit: {e}");
        }
        for (done, r) in outcomes {
            let r = match &committed_ok {
                Ok(()) => r,
                Err(e) => Err(format!("commit failed: {e}")),
            };
            if let Err(e) = &r
                && done.is_none()
            {
                tracing::warn!("a write to the state database failed: {e}");
            }
            if let Some(done) = done {
                let _ = done.send(r);
            }
        }
        committed.send_modify(|n| *n += 1);
    }
    // Closed cleanly: fold the log into the database file, so that the
    // state dir holds one self-contained file until the next start.
    if let Err(e) = conn.pragma_update(None, "wal_checkpoint", "TRUNCATE") {
        tracing::warn!("cannot checkpoint the state database: {e}");
    }
}

/// The writes to commit together, starting with `first`: all that are
/// queued, up to [`MAX_GROUP`]. While none of them has a caller waiting
/// (only [`StateDb::write_later`]s and [`StateDb::write_soon`]s: history
/// rows, results), the group waits
/// up to [`LAZY_COMMIT_DELAY`] for company, so a worker ending thousands of
/// jobs a second commits (and syncs) a few times a second, not after every
/// few jobs: that `fsync` and its thread's wake-ups took a third of a
/// dispatch-bound worker's CPU. It waits parked, not blocked in `recv`: a
/// blocked receiver is woken by every send (a futex wake and a context
/// switch per job); [`StateDb::write`] and `close` unpark it.
fn gather(first: Write, rx: &mpsc::Receiver<Write>) -> Vec<Write> {
    let until = std::time::Instant::now() + LAZY_COMMIT_DELAY;
    let mut waited_for = first.urgent;
    let mut group = vec![first];
    loop {
        loop {
            match rx.try_recv() {
                Ok(w) => {
                    waited_for |= w.urgent;
                    group.push(w);
                    if group.len() >= MAX_GROUP {
                        return group;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return group,
            }
        }
        let now = std::time::Instant::now();
        if waited_for || now >= until {
            return group;
        }
        std::thread::park_timeout(until - now);
    }
}

pub use crate::units::now_ms;

#[cfg(test)]
mod tests {
    use super::open::{APPLICATION_ID, SCHEMA_VERSION};
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn writes_are_committed_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let db = StateDb::open(&path).unwrap();
            for i in 0..100 {
                db.write_later(move |c| {
                    c.execute(
                        "INSERT INTO inputs (submission, idx, data) VALUES ('s', ?1, x'00')",
                        [i],
                    )
                    .map(drop)
                });
            }
            db.sync().await.unwrap();
            let n: i64 = db
                .read(|c| c.query_row("SELECT count(*) FROM inputs", [], |r| r.get(0)))
                .await
                .unwrap();
            assert_eq!(n, 100);
            // A failing write does not take the others of its group along.
            let bad = db
                .write(|c| c.execute("INSERT INTO nowhere VALUES (1)", []).map(drop))
                .await;
            assert!(bad.is_err());
            db.write(|c| {
                c.execute("INSERT INTO inputs VALUES ('s', 100, x'00')", [])
                    .map(drop)
            })
            .await
            .unwrap();
            // A second worker on the same dir is refused while it is open.
            let e = StateDb::open(&path).err().expect("locked").to_string();
            assert!(e.contains("in use by another peerwasm worker"), "{e}");
        }
        let db = StateDb::open(&path).unwrap();
        let n: i64 = db
            .read(|c| c.query_row("SELECT count(*) FROM inputs", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(n, 101);
    }

    /// Writes nobody waits for are committed by themselves, in one group,
    /// within about [`LAZY_COMMIT_DELAY`]; a write someone waits for takes
    /// everything queued before it along at once; closing commits the rest.
    #[tokio::test]
    async fn lazy_writes_are_grouped_and_never_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let count = |db: &StateDb| {
            db.read_blocking(|c| {
                c.query_row("SELECT count(*) FROM inputs", [], |r| r.get::<_, i64>(0))
            })
            .unwrap()
        };
        let insert = |i: i64| {
            move |c: &Connection| {
                c.execute("INSERT INTO inputs VALUES ('s', ?1, x'00')", [i])
                    .map(drop)
            }
        };
        {
            let db = StateDb::open(&path).unwrap();
            let mut committed = db.committed();
            let before = *committed.borrow_and_update();
            for i in 0..50 {
                db.write_later(insert(i));
            }
            tokio::time::timeout(Duration::from_secs(5), committed.changed())
                .await
                .expect("committed unasked")
                .unwrap();
            assert_eq!(count(&db), 50, "one group");
            assert_eq!(*committed.borrow(), before + 1);
            // A waited write behind lazy ones: all of them, now.
            db.write_later(insert(50));
            db.write(insert(51)).await.unwrap();
            assert_eq!(count(&db), 52);
            db.write_later(insert(52));
        } // dropped: closed, the last lazy write committed on the way out
        assert_eq!(count(&StateDb::open(&path).unwrap()), 53);
    }

    /// Tenants' tokens rest in the state database: the dir is made 0700
    /// and every file in it 0600, whatever they were; a dir of another
    /// user is refused.
    #[tokio::test]
    async fn state_at_rest_is_the_workers_user_alone() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        {
            let db = StateDb::open(&dir).unwrap();
            db.write(|c| {
                c.execute("INSERT INTO inputs VALUES ('s', 0, x'00')", [])
                    .map(drop)
            })
            .await
            .unwrap();
            db.keep_module(&crate::proto::ModuleHash::of(b"\0asm"), b"\0asm")
                .unwrap();
            assert_eq!(mode(&dir), 0o700);
            for f in ["state.db", "state.db-wal", "state.db-shm", "lock"] {
                assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
            }
            assert_eq!(mode(&dir.join("modules")), 0o700);
        }
        // Opened up by someone after the fact: private again at the next start.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join("state.db"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        drop(StateDb::open(&dir).unwrap());
        assert_eq!((mode(&dir), mode(&dir.join("state.db"))), (0o700, 0o600));
        // Another user's dir (the tests run as root, as CI does: chown works).
        if unsafe { libc::geteuid() } == 0 {
            let theirs = root.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = StateDb::open(&theirs).err().unwrap().to_string();
            assert!(
                e.contains("belongs to another user") && e.contains("65534"),
                "{e}"
            );
            assert_eq!(
                std::fs::metadata(&theirs).unwrap().uid(),
                65534,
                "left as it was"
            );
            assert!(!theirs.join(DB_FILE).exists());
        }
    }

    /// A state dir of the first schema is brought up to date when opened,
    /// keeping what it holds.
    #[test]
    fn an_older_schema_is_migrated_in_place() {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = Connection::open(dir.path().join(DB_FILE)).unwrap();
            c.execute_batch(&format!(
                "{SCHEMA} PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;"
            ))
            .unwrap();
            c.execute(
                "INSERT INTO detached VALUES ('j-1', 'alice', 'ab', x'00', x'01', 42)",
                [],
            )
            .unwrap();
        }
        let db = StateDb::open(dir.path()).unwrap();
        let (version, ended, uploaders): (i32, i64, i64) = db
            .read_blocking(|c| {
                c.query_row(
                    "SELECT (SELECT user_version FROM pragma_user_version), (SELECT ended_ms FROM detached), \
                     (SELECT count(*) FROM uploaders)",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
            })
            .unwrap();
        assert_eq!((version, ended, uploaders), (SCHEMA_VERSION, 42, 0));
    }

    #[test]
    fn foreign_and_damaged_state_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A directory with other things in it.
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("thesis.tex"), "x").unwrap();
        let e = StateDb::open(&home).err().unwrap().to_string();
        assert!(
            e.contains("not a peerwasm state dir") && e.contains("thesis.tex"),
            "{e}"
        );
        assert!(!home.join(DB_FILE).exists());
        // Not SQLite at all.
        let junk = dir.path().join("junk");
        std::fs::create_dir(&junk).unwrap();
        std::fs::write(junk.join(DB_FILE), b"hello, world, this is not a database").unwrap();
        let e = StateDb::open(&junk).err().unwrap().to_string();
        assert!(
            e.contains("not a SQLite database") && e.contains("nothing was deleted"),
            "{e}"
        );
        // Another program's database.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        Connection::open(other.join(DB_FILE))
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let e = StateDb::open(&other).err().unwrap().to_string();
        assert!(e.contains("another program"), "{e}");
        assert!(other.join(DB_FILE).exists());
    }
}
