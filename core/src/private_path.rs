//! Paths that must be this user's alone: a TLS private key, a worker's
//! state dir (it holds tenants' tokens). One check for all of them, so that
//! each refuses another user's path and repairs one left open to others in
//! the same way, with the same words.

use std::path::Path;

use anyhow::{Context, bail};

/// Checks that `path` belongs to the user this process runs as, and makes
/// it `mode` if the group or others may use it (said in the log: a key
/// copied with the default umask is common, and not a reason to refuse).
///
/// `what` names it in messages ("the key file"); `why` ends the refusal of
/// another user's path, saying why it must be private.
pub fn make_private(path: &Path, what: &str, mode: u32, why: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        bail!("{what} {} belongs to another user (uid {}, this process runs as {me}): {why}", path.display(), meta.uid());
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot make {what} {} private ({mode:04o})", path.display()))?;
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
        let e = make_private(Path::new("/nonexistent/key.pem"), "the key file", 0o600, "").unwrap_err();
        assert!(format!("{e:#}").contains("cannot read the key file /nonexistent/key.pem"), "{e:#}");
    }
}
