//! [`PoolDir`]: a pool joined through a shared directory (`peerwasm worker
//! --pool-dir DIR`), as the allocations of a batch system join one pool.
//!
//! Every worker started with the same directory (on a filesystem the
//! nodes share, private to the user) finds there what it needs to join:
//! the pool's gossip key (`pool.key`), its CA (`ca.crt`, `ca.key`), and the
//! addresses of the workers already in it (`members/`). The first worker
//! makes the key and the CA (race-free: the key with a no-clobber rename,
//! the CA under a lock), every worker issues its own certificate at start
//! for the host it advertises (so a new node needs nothing made for it
//! beforehand), and each lists itself in `members/` while it runs.
//! Clients use `DIR/ca.crt` (`PEERWASM_TLS_CA`) and any member's address,
//! or simply `--pool-dir DIR`.
//!
//! A pool that grows on demand has two more things here: the controller
//! that grows it (`peerwasm adapt`) says so in `controller.json`, renewed
//! every poll, with the largest job it can bring a worker for; and each
//! map run with `--pool-dir` writes its backlog into `backlog/` every
//! second, where the controller reads it even while the pool has no worker
//! to hear it (a pool at `--min 0`). Both are figures from the user's own
//! processes, in the user's own directory; they are bounded and checked
//! all the same.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::net::certs;
use crate::proto::backlog::Backlog;

pub use super::controller::{Controller, ControllerStatus};

/// The pool's gossip key file in a pool directory.
pub const KEY_FILE: &str = "pool.key";
/// Where the running workers list their addresses.
pub const MEMBERS: &str = "members";
/// Where maps write their backlog for the controller.
pub const BACKLOG: &str = "backlog";
/// The controller's notice that it grows the pool.
pub const CONTROLLER: &str = "controller.json";
/// The most a controller notice may take (its status holds a few lines).
const MAX_CONTROLLER_BYTES: usize = 16 << 10;
/// A controller notice older than this is one whose controller is gone.
pub const CONTROLLER_TTL: Duration = Duration::from_secs(30);
/// How long a backlog file counts unless rewritten (its map renews it
/// every second).
pub const BACKLOG_FILE_TTL: Duration = Duration::from_millis(crate::proto::backlog::BACKLOG_TTL_MS);
/// How long a certificate a worker issues itself at start is valid.
pub const CERT_VALIDITY: Duration = Duration::from_secs(30 * 86_400);
/// How often a running worker renews its entry in `members/`.
pub const MEMBER_RENEW: Duration = Duration::from_secs(15);
/// An entry in `members/` not renewed for this long is a worker that died
/// without leaving (killed with -9, its node lost): it is no longer
/// listed, and it is removed with the certificate its worker issued. Six
/// renewals: a busy shared filesystem or a little clock skew between
/// nodes (ages are file times) does not drop a live worker.
pub const MEMBER_TTL: Duration = Duration::from_secs(90);

/// A shared pool directory.
#[derive(Clone, Debug)]
pub struct PoolDir {
    dir: PathBuf,
}

/// What a worker takes from a pool directory to start.
#[derive(Clone, Debug)]
pub struct Joining {
    /// `--cluster-key`.
    pub key: PathBuf,
    /// `--tls-cert`, `--tls-key`, `--tls-ca`: its own certificate.
    pub tls: crate::net::tls::WorkerTls,
    /// The members to join through.
    pub members: Vec<String>,
}

impl PoolDir {
    /// The pool directory `dir`, made (0700) if it is not there; refused
    /// if another user owns it or others may enter it.
    pub fn open(dir: &Path) -> anyhow::Result<PoolDir> {
        crate::private_path::private_dir(dir)?;
        std::fs::create_dir_all(dir.join(MEMBERS))
            .with_context(|| format!("cannot make {}", dir.join(MEMBERS).display()))?;
        Ok(PoolDir {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Everything a worker reached at `host` needs to join: the key and CA
    /// (made if this is the first worker), a certificate of its own, and
    /// the members now listed.
    pub fn join(&self, host: &str) -> anyhow::Result<Joining> {
        self.prepare()?;
        self.prune_expired_certificates();
        let key = self.dir.join(KEY_FILE);
        let now = SystemTime::now();
        let stem = format!(
            "node-{}-{}",
            certs::file_stem(host),
            hex::encode(rand::random::<[u8; 4]>())
        );
        let issued = certs::issue(
            &self.dir,
            &[host.to_string()],
            Some(&stem),
            now - Duration::from_secs(3600),
            now + CERT_VALIDITY,
        )?;
        Ok(Joining {
            key,
            tls: crate::net::tls::WorkerTls {
                cert: issued.cert,
                key: issued.key,
                ca: self.dir.join(certs::CA_CERT),
            },
            members: self.members(),
        })
    }

    /// Makes the pool's key and CA unless they are there: what a
    /// controller does at start, so that clients can start before any
    /// worker has.
    pub fn prepare(&self) -> anyhow::Result<()> {
        let key = self.dir.join(KEY_FILE);
        crate::private_path::create_once(&key, &rand::random::<[u8; 32]>())
            .with_context(|| format!("cannot make the pool key {}", key.display()))?;
        self.ensure_ca()
    }

    /// Makes the CA unless there is one, holding a lock on the directory
    /// meanwhile: workers starting together make one CA, not several.
    fn ensure_ca(&self) -> anyhow::Result<()> {
        use std::os::fd::AsRawFd;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(".lock"))
            .with_context(|| format!("cannot lock {}", self.dir.display()))?;
        // SAFETY: flock(2) on a descriptor we own; released when `lock` closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            anyhow::bail!(
                "cannot lock {}: {}",
                self.dir.display(),
                std::io::Error::last_os_error()
            );
        }
        if !self.dir.join(certs::CA_KEY).exists() {
            certs::init(&self.dir)?;
        }
        Ok(())
    }

    /// The addresses the running workers listed (renewed within
    /// [`MEMBER_TTL`]). Entries past it are removed, with the certificate
    /// their worker issued itself: a worker killed with -9 leaves neither
    /// behind for long.
    pub fn members(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join(MEMBERS)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            if e.file_name().as_encoded_bytes().starts_with(b".") {
                // An entry being written (`private_path::replace`), or one
                // a killed worker left half made.
                if age(&e.path()) > MEMBER_TTL {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let mut lines = text.lines();
            let addr = lines.next().unwrap_or_default().trim();
            if age(&e.path()) > MEMBER_TTL {
                let _ = std::fs::remove_file(e.path());
                if let Some(stem) = lines.next() {
                    self.remove_certificate(stem.trim());
                }
                continue;
            }
            if !addr.is_empty() && addr.len() < 256 {
                out.push(addr.to_string());
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Lists `addr` as a member until the guard is dropped (then its entry
    /// goes, and with it `tls`, the certificate it issued itself, if any).
    /// The worker renews it every [`MEMBER_RENEW`] ([`Member::renew`]).
    pub fn register(
        &self,
        addr: &str,
        tls: Option<&crate::net::tls::WorkerTls>,
    ) -> anyhow::Result<Member> {
        let member = Member {
            path: self.dir.join(MEMBERS).join(certs::file_stem(addr)),
            text: match tls.and_then(|t| t.cert.file_stem()) {
                Some(stem) => format!("{addr}\n{}\n", stem.to_string_lossy()),
                None => format!("{addr}\n"),
            },
            certificate: tls
                .filter(|t| t.cert.parent() == Some(self.dir.as_path()))
                .map(|t| (t.cert.clone(), t.key.clone())),
        };
        member.renew()?;
        Ok(member)
    }

    /// Removes `DIR/STEM.crt` and `DIR/STEM.key` if STEM names a
    /// certificate a worker issued itself (`node-...`), nothing else.
    fn remove_certificate(&self, stem: &str) {
        if stem.starts_with("node-") && certs::file_stem(stem) == stem {
            for ext in ["crt", "key"] {
                let _ = std::fs::remove_file(self.dir.join(format!("{stem}.{ext}")));
            }
        }
    }

    /// Removes the workers' own certificates that have expired (left by
    /// workers that could not clean up after themselves).
    fn prune_expired_certificates(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".crt")
                && age(&e.path()) > CERT_VALIDITY
            {
                self.remove_certificate(stem);
            }
        }
    }
}

/// How long ago `path` was last written (zero if that cannot be read or
/// is in the future).
fn age(path: &Path) -> Duration {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().unwrap_or_default())
        .unwrap_or_default()
}

impl PoolDir {
    /// Says (again) that `controller` grows this pool.
    pub fn announce(&self, controller: &Controller) -> anyhow::Result<()> {
        let path = self.dir.join(CONTROLLER);
        let tmp = self
            .dir
            .join(format!(".{CONTROLLER}.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(controller)?)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }

    /// Takes the notice down, if it is `name`'s (a controller stopping).
    pub fn retire(&self, name: &str) {
        if self.controller().is_some_and(|c| c.name == name) {
            let _ = std::fs::remove_file(self.dir.join(CONTROLLER));
        }
    }

    /// The controller growing this pool, if one renewed its notice within
    /// [`CONTROLLER_TTL`].
    pub fn controller(&self) -> Option<Controller> {
        let path = self.dir.join(CONTROLLER);
        if age(&path) > CONTROLLER_TTL {
            return None;
        }
        let bytes = std::fs::read(&path)
            .ok()
            .filter(|b| b.len() <= MAX_CONTROLLER_BYTES)?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes a map's backlog for the controller; an empty one (the map
    /// ended) removes it.
    pub fn write_backlog(&self, backlog: &Backlog) -> anyhow::Result<()> {
        backlog.check().map_err(|e| anyhow::anyhow!(e))?;
        let dir = self.dir.join(BACKLOG);
        // Prefixed: an id of ".." names a file, not the parent.
        let path = dir.join(format!("map-{}", certs::file_stem(&backlog.id)));
        if backlog.is_empty() {
            let _ = std::fs::remove_file(&path);
            return Ok(());
        }
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".map-{}.tmp", certs::file_stem(&backlog.id)));
        std::fs::write(&tmp, postcard::to_allocvec(backlog)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// The maps' backlogs written within [`BACKLOG_FILE_TTL`] (at most
    /// [`MAX_BACKLOGS`](crate::proto::backlog::MAX_BACKLOGS), each checked);
    /// files long stale (a map killed) are removed.
    pub fn backlogs(&self) -> Vec<Backlog> {
        let Ok(entries) = std::fs::read_dir(self.dir.join(BACKLOG)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let age = age(&e.path());
            if age > 12 * BACKLOG_FILE_TTL {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            if age > BACKLOG_FILE_TTL || out.len() >= crate::proto::backlog::MAX_BACKLOGS {
                continue;
            }
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            if bytes.len() > 1024 {
                continue;
            }
            if let Ok(b) = postcard::from_bytes::<Backlog>(&bytes)
                && b.check().is_ok()
            {
                out.push(b);
            }
        }
        out
    }
}

/// A worker's entry in `members/`, removed when dropped (its worker stops)
/// with the certificate the worker issued itself.
#[derive(Debug)]
pub struct Member {
    path: PathBuf,
    text: String,
    certificate: Option<(PathBuf, PathBuf)>,
}

impl Member {
    /// Writes the entry again: it stays listed for [`MEMBER_TTL`] more
    /// (and comes back if something removed it).
    pub fn renew(&self) -> anyhow::Result<()> {
        crate::private_path::replace(&self.path, self.text.as_bytes(), 0o644)
            .with_context(|| format!("cannot list this worker in {}", self.path.display()))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some((cert, key)) = &self.certificate {
            let _ = std::fs::remove_file(cert);
            let _ = std::fs::remove_file(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_starting_together_share_one_key_and_ca_and_each_gets_a_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pool");
        let hosts = ["n1", "n2", "n2", "127.0.0.1"];
        let joins: Vec<Joining> = std::thread::scope(|s| {
            let handles: Vec<_> = hosts
                .iter()
                .map(|host| {
                    let dir = dir.clone();
                    s.spawn(move || PoolDir::open(&dir).unwrap().join(host).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let key = std::fs::read(&joins[0].key).unwrap();
        assert_eq!(key.len(), 32);
        for (j, host) in joins.iter().zip(hosts) {
            assert_eq!(std::fs::read(&j.key).unwrap(), key, "one key");
            assert_eq!(j.tls.ca, dir.join("ca.crt"));
            // The one CA signed every certificate, for the host each named.
            assert_eq!(
                crate::net::tls::would_refuse(&j.tls.cert, &j.tls.ca, host).unwrap(),
                None,
                "{host}"
            );
        }
        assert_ne!(
            joins[1].tls.cert, joins[2].tls.cert,
            "two workers on one node: two certificates"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&dir).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn backlogs_and_the_controller_notice_go_through_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = PoolDir::open(tmp.path()).unwrap();
        assert!(pool.controller().is_none() && pool.backlogs().is_empty());
        let c = Controller {
            name: "peerwasm-adapt-1".into(),
            host: "login1".into(),
            pid: 7,
            max_workers: 8,
            largest_job: 1 << 30,
            status: Default::default(),
        };
        pool.announce(&c).unwrap();
        assert_eq!(pool.controller(), Some(c.clone()));
        let b = Backlog {
            id: "m-1/../x".into(),
            waiting: 10,
            running: 0,
            memory_bytes: 1 << 20,
            largest_bytes: 2 << 20,
            job_ms: 0,
        };
        pool.write_backlog(&b).unwrap();
        assert_eq!(pool.backlogs(), std::slice::from_ref(&b));
        // A forged file is ignored, a forged report refused.
        std::fs::write(tmp.path().join(BACKLOG).join("junk"), b"\xff\xff\xff").unwrap();
        assert_eq!(pool.backlogs().len(), 1);
        assert!(
            pool.write_backlog(&Backlog {
                waiting: u64::MAX,
                ..b.clone()
            })
            .is_err()
        );
        // The map's end clears it; a controller retires its own notice only.
        pool.write_backlog(&Backlog {
            waiting: 0,
            running: 0,
            ..b
        })
        .unwrap();
        assert!(pool.backlogs().is_empty());
        pool.retire("someone-else");
        assert!(pool.controller().is_some());
        pool.retire(&c.name);
        assert!(pool.controller().is_none());
    }

    #[test]
    fn members_list_themselves_while_they_run() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = PoolDir::open(tmp.path()).unwrap();
        let a = pool.register("10.0.0.1:40001", None).unwrap();
        let b = pool.register("node2:40002", None).unwrap();
        assert_eq!(pool.members(), ["10.0.0.1:40001", "node2:40002"]);
        // An entry being written is not read half made; one a killed
        // worker left goes after the entries' time to live.
        let writing = tmp.path().join(MEMBERS).join(".peerwasm-half");
        std::fs::write(&writing, "10.0.").unwrap();
        assert_eq!(pool.members(), ["10.0.0.1:40001", "node2:40002"]);
        assert!(writing.exists());
        backdate(&writing, MEMBER_TTL + Duration::from_secs(10));
        pool.members();
        assert!(!writing.exists());
        drop(a);
        assert_eq!(pool.members(), ["node2:40002"]);
        drop(b);
        assert!(pool.members().is_empty());
    }

    /// Backdates `path` by `by`.
    fn backdate(path: &Path, by: Duration) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - by).unwrap();
    }

    #[test]
    fn a_worker_that_died_without_leaving_is_unlisted_with_its_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = PoolDir::open(tmp.path()).unwrap();
        let (live, dead) = (pool.join("n1").unwrap(), pool.join("n2").unwrap());
        let alive = pool.register("n1:40001", Some(&live.tls)).unwrap();
        let killed = pool.register("n2:40002", Some(&dead.tls)).unwrap();
        // Killed with -9: no drop ran, the entry just stopped being renewed.
        std::mem::forget(killed);
        let entry = |addr: &str| tmp.path().join(MEMBERS).join(certs::file_stem(addr));
        backdate(&entry("n1:40001"), MEMBER_TTL - Duration::from_secs(10));
        backdate(&entry("n2:40002"), MEMBER_TTL + Duration::from_secs(10));
        assert_eq!(pool.members(), ["n1:40001"], "the stale one is not listed");
        assert!(!entry("n2:40002").exists() && !dead.tls.cert.exists() && !dead.tls.key.exists());
        assert!(live.tls.cert.exists(), "the live one's certificate stays");
        // Renewed, a live worker is listed again even if its entry was lost.
        std::fs::remove_file(entry("n1:40001")).unwrap();
        alive.renew().unwrap();
        assert_eq!(pool.members(), ["n1:40001"]);
        // A clean stop takes its certificate with it.
        drop(alive);
        assert!(pool.members().is_empty() && !live.tls.cert.exists() && !live.tls.key.exists());
        // Certificates past their validity go at the next join; the CA stays.
        let old = pool.join("n3").unwrap();
        backdate(&old.tls.cert, CERT_VALIDITY + Duration::from_secs(60));
        let _ = pool.join("n4").unwrap();
        assert!(!old.tls.cert.exists() && !old.tls.key.exists());
        assert!(
            tmp.path().join(certs::CA_CERT).exists() && tmp.path().join(certs::CA_KEY).exists()
        );
    }
}
