//! How a [`JobSpec`] is kept in a worker's state database (detached jobs,
//! submissions): apart from its wire form, so that each may change on its
//! own. A spec kept by this build is [`STORED`] and then its postcard; one
//! kept by a worker of protocol 4 to 10 is the wire form of its day — with
//! the `dirs` the wire then carried (always empty: workers refused any),
//! and without the fields added since (`invoke` after protocol 4, `warm`
//! after 9) — and is still read, so kept jobs and submissions survive an
//! upgrade. A spec kept by protocol 11 (`pws1` without `memory_reserve`,
//! the last field) reads as one with no reserve.

use serde::Deserialize;

use super::{DirGrant, JobLimits, JobSpec, ModuleHash, WarmStart, submission, tree};

/// What a spec kept by this build starts with.
pub const STORED: &[u8; 4] = b"pws1";

/// The wire form of protocol 10 (protocols 4 to 9: less its last fields).
#[derive(Deserialize)]
struct Protocol10 {
    module: ModuleHash,
    program_name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    stdin: Vec<u8>,
    #[allow(dead_code, reason = "read to keep the layout; workers refused any")]
    dirs: Vec<DirGrant>,
    trees: Vec<tree::TreeGrant>,
    limits: JobLimits,
    tag: Option<submission::JobTag>,
    invoke: Option<String>,
    warm: Option<WarmStart>,
}

impl JobSpec {
    /// The bytes to keep in a state database ([`from_stored`](Self::from_stored)
    /// reads them).
    pub fn to_stored(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut bytes = STORED.to_vec();
        bytes.extend(postcard::to_allocvec(self)?);
        Ok(bytes)
    }

    /// Decodes a spec kept in a state database: by this build, or by a
    /// worker of protocol 4 to 10 (see the module docs).
    pub fn from_stored(bytes: &[u8]) -> Result<JobSpec, postcard::Error> {
        if let Some(kept) = bytes.strip_prefix(STORED) {
            // Kept before `memory_reserve` (its last field) existed: none.
            return postcard::from_bytes(kept).or_else(|e| {
                let mut older = kept.to_vec();
                older.push(0);
                postcard::from_bytes(&older).map_err(|_| e)
            });
        }
        let old: Protocol10 = postcard::from_bytes(bytes).or_else(|e| {
            let mut older = bytes.to_vec();
            // `warm: None` (protocol 9), then also `invoke: None` (4).
            (0..2)
                .find_map(|_| {
                    older.push(0);
                    postcard::from_bytes(&older).ok()
                })
                .ok_or(e)
        })?;
        Ok(JobSpec {
            module: old.module,
            program_name: old.program_name,
            args: old.args,
            env: old.env,
            stdin: old.stdin,
            dirs: Vec::new(),
            trees: old.trees,
            limits: old.limits,
            tag: old.tag,
            invoke: old.invoke,
            warm: old.warm,
            memory_reserve: None,
        })
    }
}
