//! Opening the state database: the state dir made or checked (private to
//! the worker's user, ours, not another worker's: a lock file), the SQLite
//! file checked (ours, not damaged, not from a newer peerwasm) and its
//! schema created or migrated. Everything it refuses, it refuses with a
//! message that says what to do, deleting nothing.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, bail};
use rusqlite::Connection;

/// The database's file name in the state dir.
pub const DB_FILE: &str = "state.db";

/// Marks a SQLite file as ours (`PRAGMA application_id`): "pwsm".
pub const APPLICATION_ID: i32 = 0x7077_736d;

/// The schema this build reads and writes (`PRAGMA user_version`): the
/// first, then each of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 1 + MIGRATIONS.len() as i32;

/// Each brings the schema from version `i + 1` to `i + 2`; a database of an
/// older peerwasm is brought up to date when opened.
pub(super) const MIGRATIONS: [&str; 1] = [
    // 2: who showed which module (`uploaders.rs`), so that every tenant's
    // jobs run again after a restart; when a detached job ended, so that
    // finished ones expire (`--keep-results`).
    "CREATE TABLE uploaders (
        module TEXT NOT NULL,
        tenant TEXT NOT NULL,
        shown_ms INTEGER NOT NULL,
        PRIMARY KEY (module, tenant)
    ) WITHOUT ROWID;
    ALTER TABLE detached ADD COLUMN ended_ms INTEGER;
    UPDATE detached SET ended_ms = created_ms WHERE result IS NOT NULL;",
];

pub(super) const SCHEMA: &str = "
CREATE TABLE submissions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    token TEXT,
    module TEXT NOT NULL,
    job BLOB NOT NULL,
    config BLOB NOT NULL,
    total INTEGER NOT NULL,
    state TEXT NOT NULL,
    message TEXT,
    created_ms INTEGER NOT NULL,
    ended_ms INTEGER
);
CREATE TABLE inputs (
    submission TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (submission, idx)
) WITHOUT ROWID;
CREATE TABLE results (
    submission TEXT NOT NULL,
    idx INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    peak INTEGER NOT NULL,
    item BLOB NOT NULL,
    PRIMARY KEY (submission, idx)
) WITHOUT ROWID;
CREATE TABLE history (
    ended_ms INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    module TEXT NOT NULL,
    submission TEXT,
    idx INTEGER,
    attempt INTEGER,
    outcome TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    peak INTEGER NOT NULL,
    reserved INTEGER NOT NULL,
    cpu_us INTEGER NOT NULL,
    wall_us INTEGER NOT NULL,
    peer TEXT NOT NULL
);
CREATE INDEX history_by_end ON history (ended_ms);
CREATE TABLE detached (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    module TEXT NOT NULL,
    spec BLOB NOT NULL,
    result BLOB,
    created_ms INTEGER NOT NULL
);
";

/// Creates `dir` (only the owner may enter it: the database holds tenants'
/// tokens), or checks that an existing one is a state dir, ours, and makes
/// it private (0700) if it was not.
pub(super) fn prepare_dir(dir: &Path, db_path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create the state dir {}", dir.display()))?;
        return Ok(());
    }
    if !dir.is_dir() {
        bail!("--state-dir {} is not a directory", dir.display());
    }
    if !db_path.exists() {
        let ours = ["lock", "modules", "estimates"];
        let foreign: Vec<String> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the state dir {}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !ours.contains(&name.as_str()))
            .collect();
        if !foreign.is_empty() {
            bail!(
                "--state-dir {} is not a peerwasm state dir: it holds other files ({}) and no {DB_FILE}. \
                 Give an empty or new directory; nothing was changed",
                dir.display(),
                foreign
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    crate::private_path::make_private(
        dir,
        "the state dir",
        0o700,
        "it holds tenants' tokens, so it must be this user's alone. Give a directory of this user's; nothing was changed",
    )
}

/// Makes `path` (a file of the state dir) readable by its owner alone, if
/// it exists; creates it so if `create`.
pub(super) fn private_file(path: &Path, create: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if create && !path.exists() {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot make {} private (0600)", path.display()))
        }
        _ => Ok(()),
    }
}

/// Takes the state dir's lock, or says who has it.
pub(super) fn lock_dir(dir: &Path) -> anyhow::Result<File> {
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    private_file(&path, true)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "the state dir {} is in use by another peerwasm worker: give each worker its own --state-dir",
            dir.display()
        );
    }
    Ok(file)
}

/// Opens the database read-write, checks it is ours and whole, and creates
/// the schema in a new one.
pub(super) fn open_checked(db_path: &Path) -> anyhow::Result<Connection> {
    let shown = db_path.display();
    let keep = "nothing was deleted: move it away (or give another --state-dir) to start afresh";
    if let Ok(meta) = std::fs::metadata(db_path)
        && meta.len() > 0
    {
        let mut header = [0u8; 16];
        let read = std::io::Read::read(&mut File::open(db_path)?, &mut header)?;
        if read < 16 || &header != b"SQLite format 3\0" {
            bail!("{shown} is not a SQLite database (a damaged or foreign file); {keep}");
        }
    }
    let conn = Connection::open(db_path).with_context(|| format!("cannot open {shown}"))?;
    let broken =
        |e: rusqlite::Error| anyhow::anyhow!("{shown} cannot be read ({e}): it is damaged; {keep}");
    let app: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(broken)?;
    let version: i32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(broken)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(broken)?;
    if app != APPLICATION_ID && (app != 0 || tables > 0) {
        bail!(
            "{shown} is a SQLite database of another program (application_id {app:#x}), not peerwasm's; {keep}"
        );
    }
    if app == APPLICATION_ID && version > SCHEMA_VERSION {
        bail!(
            "{shown} was written by a newer peerwasm (schema {version}; this one reads {SCHEMA_VERSION}); {keep}"
        );
    }
    let check: Vec<String> = {
        let mut stmt = conn.prepare("PRAGMA quick_check").map_err(broken)?;
        stmt.query_map([], |r| r.get(0))
            .map_err(broken)?
            .collect::<Result<_, _>>()
            .map_err(broken)?
    };
    if check.first().map(String::as_str) != Some("ok") {
        bail!(
            "{shown} is damaged ({}); {keep}",
            check.into_iter().take(3).collect::<Vec<_>>().join("; ")
        );
    }
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(broken)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(broken)?;
    let (from, create) = if app == 0 {
        (1, SCHEMA)
    } else {
        (version.max(1), "")
    };
    if app == 0 || from < SCHEMA_VERSION {
        let steps = MIGRATIONS[(from - 1) as usize..].join("\n");
        conn.execute_batch(&format!(
            "BEGIN; {create} {steps} PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))
        .with_context(|| format!("cannot bring the schema of {shown} up to version {SCHEMA_VERSION}"))?;
    }
    Ok(conn)
}
