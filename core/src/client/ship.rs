//! Shipping a job's host directories to a worker (`proto::tree`): each
//! `--dir` hashed once per pool ([`Pool::ship`]), and, when a worker
//! answers that it lacks something, the module (404) or the trees and
//! their missing files (424) sent once per worker for every submission
//! that found them missing ([`Pool::provide`]).
//!
//! Files are streamed from disk, never read whole into memory. A file
//! that changed between hashing and sending no longer matches its hash;
//! the worker refuses it and the job fails naming the file, rather than
//! running on data that is neither the old nor the new.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use reqwest::StatusCode;

use super::api::{ApiError, WorkerApi};
use super::errors::{PeerError, SubmitError};
use super::job::Job;
use super::pool::Pool;
pub use super::tree::ShippedTree;
use crate::proto::JobSpec;
use crate::proto::tree::MISSING_STATUS;

/// Tries of one job on one worker: as sent, after its module, after its
/// trees.
pub(super) const PROVIDE_ATTEMPTS: usize = 3;

/// A job as it goes to a pool: its directories as trees.
pub(super) struct Shipped<'a> {
    spec: Cow<'a, JobSpec>,
    /// The trees, in the order of the spec's `dirs`.
    pub trees: Vec<Arc<ShippedTree>>,
}

impl Shipped<'_> {
    /// The spec to send.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }
}

impl Pool {
    /// POSTs `body` (postcard) as `what` to `addr`; a worker that answers it
    /// lacks the module (404) or files of `trees` (424) is given them
    /// ([`provide`](Self::provide)) and asked again. Returns the response
    /// once it has the route's status of success, else the refusal.
    pub(super) async fn post_providing(
        &self,
        addr: &str,
        what: super::api::JobPost,
        job: &Job,
        trees: &[Arc<ShippedTree>],
        body: bytes::Bytes,
    ) -> Result<reqwest::Response, PeerError> {
        let api = WorkerApi::new(self.client_for(addr), addr);
        for attempt in 0..PROVIDE_ATTEMPTS {
            let sent = Instant::now();
            match api.post_carrying(what, body.clone()).await {
                Ok(resp) => return Ok(resp),
                Err(ApiError::Status {
                    status,
                    message,
                    largest,
                }) => {
                    if attempt + 1 < PROVIDE_ATTEMPTS
                        && self.provide(addr, status, job, trees, sent).await?
                    {
                        continue;
                    }
                    return Err(self.read_refusal(addr, status, message, largest));
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// `spec` with its host directories (`dirs`) replaced by trees, hashed
    /// on first use (on a blocking thread) and then shared by every job of
    /// this pool handle that grants the same directory.
    pub(super) async fn ship<'a>(&self, spec: &'a JobSpec) -> Result<Shipped<'a>, SubmitError> {
        if spec.dirs.is_empty() {
            return Ok(Shipped {
                spec: Cow::Borrowed(spec),
                trees: Vec::new(),
            });
        }
        let mut trees = Vec::with_capacity(spec.dirs.len());
        for dir in &spec.dirs {
            let cell = self.shipped.lock().entry(dir.clone()).or_default().clone();
            let tree = cell
                .get_or_try_init(|| async {
                    let (dir, cache) = (dir.clone(), self.hash_cache().map(|p| p.to_path_buf()));
                    tokio::task::spawn_blocking(move || super::tree::scan(&dir, cache.as_deref()))
                        .await
                        .map_err(|e| {
                            SubmitError::Fatal(format!("hashing the directory failed: {e}"))
                        })?
                        .map(Arc::new)
                        .map_err(|e| SubmitError::Fatal(format!("{e:#}")))
                })
                .await?;
            trees.push(tree.clone());
        }
        let mut shipped = spec.clone();
        shipped.dirs.clear();
        shipped.trees = trees.iter().map(|t| t.grant.clone()).collect();
        Ok(Shipped {
            spec: Cow::Owned(shipped),
            trees,
        })
    }

    /// Sends `addr` what a refusal with `status` says it lacks — the module
    /// (404) or the job's trees (424) — once for all the submissions sent
    /// since `sent`. `Ok(false)`: the status asks for nothing.
    pub(super) async fn provide(
        &self,
        addr: &str,
        status: StatusCode,
        job: &Job,
        trees: &[Arc<ShippedTree>],
        sent: Instant,
    ) -> Result<bool, PeerError> {
        if status == StatusCode::NOT_FOUND {
            self.upload_once(addr, job, sent).await?;
            return Ok(true);
        }
        if status.as_u16() != MISSING_STATUS || trees.is_empty() {
            return Ok(false);
        }
        for tree in trees {
            self.once(addr, tree.grant.manifest, sent, self.send_tree(addr, tree))
                .await?;
        }
        Ok(true)
    }

    /// The manifest, then each file the worker says it lacks.
    async fn send_tree(&self, addr: &str, tree: &ShippedTree) -> Result<(), PeerError> {
        let api = WorkerApi::new(self.client_for(addr), addr);
        let missing = api
            .put_tree(&tree.grant.manifest, tree.encoded.clone())
            .await
            .map_err(|e| upload_refused("the directory", e))?;
        for hash in missing {
            let Some(path) = tree.sources.get(&hash) else {
                return Err(PeerError::Fatal(format!(
                    "the worker asks for file {hash}, which the tree does not have"
                )));
            };
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| PeerError::Fatal(format!("cannot read {}: {e}", path.display())))?;
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
            api.put_file(&hash, body)
                .await
                .map_err(|e| upload_refused(&path.display().to_string(), e))?;
        }
        Ok(())
    }
}

/// A refused tree or file upload: the request is wrong (400: a bad tree, a
/// file changed since it was hashed) — no worker would take it; anything
/// else (too large here, no room now) — try another worker.
fn upload_refused(what: &str, refused: ApiError) -> PeerError {
    match refused {
        ApiError::Status {
            status: StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED,
            message,
            ..
        } => PeerError::Fatal(format!("{what} was refused: {message}")),
        ApiError::Status {
            status, message, ..
        } => PeerError::Declined(format!("{what} was refused: {status} {message}")),
        other => other.into(),
    }
}

impl Pool {
    /// Where file hashes are kept between runs.
    fn hash_cache(&self) -> Option<&std::path::Path> {
        self.config.hash_cache.as_deref()
    }
}
