//! Paths that must be this user's alone: a TLS private key, a worker's
//! state dir (it holds tenants' tokens), the pool key a loopback pool
//! gossips under, the host's ledger file. One check for all of them, so that
//! each refuses another user's path and repairs one left open to others in
//! the same way, with the same words.
//!
//! Files another user of the machine could have planted (in `/dev/shm`,
//! `/tmp`) are opened without following a link ([`open_private_file`]) and
//! checked on the open descriptor, not on the path: a check of the path
//! followed by an open is a race another user can win. Many machines run
//! with `fs.protected_symlinks`/`protected_regular` off, so the kernel does
//! not do this for us.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() }
}

/// This user's private directory on this machine, for what the machine's
/// other users must neither read nor plant (the pool key, the host's
/// ledger): `/dev/shm/peerwasm-UID` (memory, gone at reboot like what it
/// holds; the temp dir where there is no `/dev/shm`), made `0700`. A
/// directory of that name that is a link or another user's is refused,
/// naming it: someone else made it.
///
/// Not `$XDG_RUNTIME_DIR`: a worker started in one login session must find
/// what one started elsewhere made (a batch job has no such variable, or
/// the login node's), and systemd removes that dir at the user's last
/// logout while the workers run on.
pub fn user_runtime_dir() -> anyhow::Result<PathBuf> {
    let dir = user_runtime_path();
    private_dir(&dir)?;
    Ok(dir)
}

/// Where [`user_runtime_dir`] is, without making or checking it.
pub fn user_runtime_path() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("peerwasm-{}", euid()))
}

/// Makes `dir` (`0700`) unless it exists, then checks it is a directory
/// (not a link) of this user's, made private if it was open to others.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => bail!("cannot make the private directory {}: {e}", dir.display()),
    }
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "{} is not a directory (a link, or a file someone put there): remove it",
            dir.display()
        );
    }
    if meta.uid() != euid() {
        bail!(
            "{} belongs to another user (uid {}): it may have been made to read or plant what this user keeps there; \
             remove it, or point peerwasm elsewhere",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))?;
    }
    Ok(())
}

/// Who may share a file: this user alone (`0600`), or the members of the
/// group of the directory it is in (`0660`, the directory not writable by
/// others): a lab whose workers run as different users.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// This user alone.
    Private,
    /// The group of the file's directory.
    Group,
}

/// Opens `path` read-write (made, with the sharing's mode, if `create`
/// and missing) without following a link, and checks the open file: a
/// regular file with one name, this user's and `0600` — or, for
/// [`Sharing::Group`], of the directory's group, `0660` at most, in a
/// directory others cannot write. Anything else is refused, naming what
/// is wrong; nothing is written to it.
pub fn open_private_file(
    path: &Path,
    what: &str,
    create: bool,
    sharing: Sharing,
) -> anyhow::Result<File> {
    let mode = match sharing {
        Sharing::Private => 0o600,
        Sharing::Group => 0o660,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow::anyhow!(
                "{what} {} is a symbolic link: refused (someone may have planted it)",
                path.display()
            ),
            _ => anyhow::anyhow!("cannot open {what} {}: {e}", path.display()),
        })?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    let refuse = |why: String| {
        anyhow::anyhow!(
            "{what} {} {why}: refused (remove it, or give another path)",
            path.display()
        )
    };
    if !meta.is_file() {
        return Err(refuse("is not a regular file".into()));
    }
    if meta.nlink() != 1 {
        return Err(refuse(format!(
            "has {} names (a hard link someone made?)",
            meta.nlink()
        )));
    }
    match sharing {
        Sharing::Private => {
            if meta.uid() != euid() {
                return Err(refuse(format!(
                    "belongs to another user (uid {})",
                    meta.uid()
                )));
            }
            if meta.mode() & 0o077 != 0 {
                return Err(refuse(format!(
                    "is open to others (mode {:04o}; it must be 0600)",
                    meta.mode() & 0o777
                )));
            }
        }
        Sharing::Group => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let dmeta =
                std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
            if dmeta.mode() & 0o002 != 0 {
                return Err(refuse(format!(
                    "is in {}, which anyone may write to",
                    dir.display()
                )));
            }
            if meta.gid() != dmeta.gid() || meta.mode() & 0o007 != 0 {
                return Err(refuse(format!(
                    "is not the group's alone (group {}, mode {:04o}; the directory's group is {})",
                    meta.gid(),
                    meta.mode() & 0o777,
                    dmeta.gid()
                )));
            }
        }
    }
    Ok(file)
}

/// A secret of this user's kept in `path`: read if the file is there (and
/// private: [`open_private_file`]), else made (`bytes` random bytes,
/// hex) — by whichever of several processes starting at once gets there
/// first; the others read the same one.
pub fn private_secret(path: &Path, what: &str, bytes: usize) -> anyhow::Result<Vec<u8>> {
    if std::fs::symlink_metadata(path).is_err() {
        let secret: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
        create_once(path, hex::encode(&secret).as_bytes())
            .with_context(|| format!("cannot make {what} {}", path.display()))?;
    }
    let mut secret = Vec::new();
    open_private_file(path, what, false, Sharing::Private)?
        .read_to_end(&mut secret)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    if secret.trim_ascii().is_empty() {
        bail!(
            "{what} {} is empty: remove it and a new one is made",
            path.display()
        );
    }
    Ok(secret.trim_ascii().to_vec())
}

/// Makes `path` hold `contents` (mode 0600) unless something is there
/// already: written whole in a temporary file beside it, then renamed into
/// place only if nothing is there yet, so that processes starting together
/// agree on one file and none ever reads half of one. `Ok(false)`: another
/// got there first (its file is left as it is).
pub fn create_once(path: &Path, contents: &[u8]) -> std::io::Result<bool> {
    match staged(path, contents, 0o600)?.persist_noclobber(path) {
        Ok(_) => Ok(true),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e.error),
    }
}

/// Makes `path` hold `contents` with permission bits `mode`, replacing
/// what was there in one step: written whole in a temporary file beside
/// it, then renamed over it. A reader (another worker, a client starting
/// meanwhile) sees the old file or the new one, never an empty or half
/// written one, as it would between `open(O_TRUNC)` and `write`.
pub fn replace(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    staged(path, contents, mode)?
        .persist(path)
        .map(drop)
        .map_err(|e| e.error)
}

/// `contents` written and synced in a temporary file (mode `mode`) in
/// `path`'s directory, removed if it is dropped unpersisted.
fn staged(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".peerwasm-")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    Ok(tmp)
}

/// Checks that `path` belongs to the user this process runs as, and makes
/// it `mode` if the group or others may use it (said in the log: a key
/// copied with the default umask is common, and not a reason to refuse).
///
/// `what` names it in messages ("the key file"); `why` ends the refusal of
/// another user's path, saying why it must be private.
pub fn make_private(path: &Path, what: &str, mode: u32, why: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        bail!(
            "{what} {} belongs to another user (uid {}, this process runs as {me}): {why}",
            path.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_context(
            || format!("cannot make {what} {} private ({mode:04o})", path.display()),
        )?;
        tracing::info!(path = %path.display(), "{what} was open to others ({:o}): made it {mode:04o}", meta.mode() & 0o777);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn replace_swaps_the_whole_file_in_with_its_mode_and_leaves_nothing_beside() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("ca.crt");
        replace(&cert, b"first", 0o644).unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), b"first");
        assert_eq!(mode(&cert), 0o644);
        // A reader holding the old file keeps reading it whole: the new
        // one is another inode, renamed over the name.
        let mut held = std::fs::File::open(&cert).unwrap();
        replace(&cert, b"second", 0o600).unwrap();
        let mut old = String::new();
        std::io::Read::read_to_string(&mut held, &mut old).unwrap();
        assert_eq!(old, "first");
        assert_eq!(std::fs::read(&cert).unwrap(), b"second");
        assert_eq!(mode(&cert), 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["ca.crt"], "no temporary file is left");
        // Into a directory that is not there: an error, nothing made.
        assert!(replace(&dir.path().join("no/such"), b"x", 0o600).is_err());
    }

    #[test]
    fn a_path_open_to_others_is_made_private_and_a_private_one_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, "k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        make_private(&key, "the key file", 0o600, "").unwrap();
        assert_eq!(mode(&key), 0o600);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        make_private(&key, "the key file", 0o600, "").unwrap();
        assert_eq!(mode(&key), 0o400, "a path already private keeps its mode");
    }

    #[test]
    fn a_missing_path_is_named() {
        let e =
            make_private(Path::new("/nonexistent/key.pem"), "the key file", 0o600, "").unwrap_err();
        assert!(
            format!("{e:#}").contains("cannot read the key file /nonexistent/key.pem"),
            "{e:#}"
        );
    }
}
