//! [`Pool`]: the client's handle on a pool of workers — the pool view
//! (refreshed from any worker that answers), the candidates for a job (best
//! fit, least loaded by us first), module uploads (once per worker) and how
//! a worker's refusal reads. Sending one job to the pool is `send.rs`;
//! shipping its directories `ship.rs`.
//!
//! A worker that cannot be reached is avoided for a moment; a worker that
//! breaks a connection with a job on it has lost that job, which is reported
//! as [`SubmitError::Lost`] so that the caller (`map`) resubmits it.
//!
//! Jobs, and the tenant's token, go only to workers the client has a
//! reason to trust: those the user named (the seeds), those the answering
//! worker vouches for ([`PeerView::vouched`]: heard in gossip sealed with
//! the pool's key), and, over TLS, any the pool's CA certifies at the
//! handshake. An advert anyone could have sent names no placement target:
//! otherwise whoever reaches a worker (another user of the same machine,
//! on loopback) could plant one pointing at a process of theirs and
//! receive the jobs' inputs, answer with forged results, and collect
//! tokens. The others are left out of the view, and said once.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use super::api::{ApiError, WorkerApi, http_client};
use super::batcher::Batchers;
use super::errors::{Broken, PeerError, SubmitError};
use super::job::Job;
use super::placement;
use super::tree::ShippedTrees;
use crate::gossip::{Liveness, PeerView};
use crate::net::{HttpClient, Transport};
use crate::proto::{JobSpec, ModuleHash};
use crate::units::Bytes;

/// The most members of a growing pool one view asks for their own record
/// (those that joined since the last gossip reached the view's worker).
const NEW_MEMBERS_ASKED: usize = 16;
/// How long a new member may take to answer for its record: one that
/// just joined answers in milliseconds; one that is gone (its entry not
/// yet expired) must not hold up the map that asked.
const NEW_MEMBER_PATIENCE: Duration = Duration::from_millis(300);
/// How often a growing pool's cached view is checked against its
/// directory's members (a directory read).
const MEMBERS_LOOK: Duration = Duration::from_millis(100);
/// How long a worker that did not answer for its view is asked last (a
/// growing pool's new member: not at all).
const SILENT_FOR: Duration = Duration::from_secs(10);

/// When a module (or tree) was last uploaded to a worker; locked while an
/// upload is under way, so that it goes once.
type UploadedAt = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// How a [`Pool`] behaves.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Workers to ask for the pool view (`host:port`).
    pub seeds: Vec<String>,
    /// How old a pool view may be before it is fetched again. Default: 500 ms.
    pub view_max_age: Duration,
    /// How long to wait for a live worker to appear before giving up.
    /// Default: 30 s.
    pub no_peer_patience: Duration,
    /// How long a worker that refused connections is skipped. Default: 2 s.
    pub avoid_for: Duration,
    /// The tenant's token, sent as `Authorization: Bearer`. Default: none.
    pub token: Option<String>,
    /// Where the hashes of shipped directories' files are kept between
    /// runs (`client::tree`); none: every file is hashed on every run.
    /// Default: none.
    pub hash_cache: Option<std::path::PathBuf>,
    /// Plain HTTP or TLS with the pool's CA; whether the token may go in
    /// clear off loopback. Default: plain HTTP, token to loopback only.
    pub transport: Transport,
    /// The pool grows on demand (a controller runs it): its members are
    /// read again at every view, and a job no worker can hold yet waits
    /// for one. Default: none (a fixed pool).
    pub growth: Option<super::growth::Growth>,
}

impl PoolConfig {
    /// Defaults with these seeds.
    pub fn new(seeds: Vec<String>) -> PoolConfig {
        PoolConfig {
            seeds,
            view_max_age: Duration::from_millis(500),
            no_peer_patience: Duration::from_secs(30),
            avoid_for: Duration::from_secs(2),
            token: None,
            hash_cache: None,
            transport: Transport::plain(),
            growth: None,
        }
    }
}

/// A pool of workers, as seen from a client. Cheap to share (`Arc`).
pub struct Pool {
    pub(super) config: PoolConfig,
    /// With the tenant's token, for trusted workers.
    http: HttpClient,
    /// Without it, for the others.
    anon: HttpClient,
    /// The workers of the last view that may be sent jobs and the token
    /// besides the seeds (vouched for, or certified over TLS).
    vouched: Mutex<std::collections::HashSet<String>>,
    /// Unvouched workers already said in the log (once each).
    unvouched_said: Mutex<std::collections::HashSet<String>>,
    /// Workers that did not answer for their view (or, new members of a
    /// growing pool, their own record), and since when: asked last.
    silent_members: Mutex<std::collections::HashMap<String, Instant>>,
    view: tokio::sync::Mutex<View>,
    /// When we last uploaded each module (or tree) to each worker.
    uploaded: Mutex<HashMap<(String, ModuleHash), UploadedAt>>,
    /// Host directories hashed for shipping, each once per pool.
    pub(super) shipped: ShippedTrees,
    /// Jobs of ours on each worker now (placement spreads by it).
    load: Mutex<HashMap<String, u32>>,
    /// Workers that refused a connection, until when to skip them.
    avoid: Mutex<HashMap<String, Instant>>,
    /// Jobs on their way to each worker, sent in batches.
    pub(super) batchers: Batchers,
    /// Probes in flight of workers whose connections broke (`loss.rs`).
    pub(super) probes: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Broken>>>>,
}

#[derive(Default)]
struct View {
    peers: Vec<PeerView>,
    fetched: Option<Instant>,
    /// When a growing pool's directory was last compared with `peers`.
    members_looked: Option<Instant>,
}

impl Pool {
    /// A pool reached through `config.seeds`. `Err` if a token would go
    /// in clear to a seed off loopback (see [`Transport`]).
    pub fn new(config: PoolConfig) -> anyhow::Result<Pool> {
        if config.token.is_some() {
            config.transport.check_token_hops(&config.seeds)?;
        }
        let http = http_client(config.token.as_deref(), &config.transport)?;
        Ok(Pool {
            anon: http_client(None, &config.transport)?,
            config,
            http,
            vouched: Mutex::new(Default::default()),
            unvouched_said: Mutex::new(Default::default()),
            silent_members: Mutex::new(Default::default()),
            view: tokio::sync::Mutex::new(View::default()),
            uploaded: Mutex::new(HashMap::new()),
            shipped: Default::default(),
            load: Mutex::new(HashMap::new()),
            avoid: Mutex::new(HashMap::new()),
            batchers: Batchers::new(),
            probes: Mutex::new(HashMap::new()),
        })
    }

    /// The pool view, fetched again when older than `view_max_age` — or,
    /// for a growing pool, when its directory lists a member the view does
    /// not have (looked at no more than every `MEMBERS_LOOK`): a worker
    /// that joins gets work at once, not a view's age later.
    pub async fn view(&self) -> anyhow::Result<Vec<PeerView>> {
        let mut view = self.view.lock().await;
        if let Some(fetched) = view.fetched
            && fetched.elapsed() <= self.config.view_max_age
            && !self.joined_since(&mut view)
        {
            return Ok(view.peers.clone());
        }
        // The seeds first, then any live worker we know of: a map outlives
        // the death of the worker it was pointed at.
        let seeds = self.seeds();
        let mut ask = seeds.clone();
        for p in view.peers.iter().filter(|p| p.liveness == Liveness::Alive) {
            if !ask.contains(&p.advert.addr) {
                ask.push(p.advert.addr.clone());
            }
        }
        // Named workers are asked with the token, others only if trusted;
        // those that did not answer lately, last (a stopped worker that
        // still accepts would make every view wait its timeout).
        let (mut named, mut others): (Vec<String>, Vec<String>) =
            ask.into_iter().partition(|a| seeds.contains(a));
        {
            let mut silent = self.silent_members.lock();
            silent.retain(|_, since| since.elapsed() < SILENT_FOR);
            let quiet = |a: &String| silent.contains_key(a);
            named.sort_by_key(quiet);
            others.sort_by_key(quiet);
        }
        let mut note = |addr: &str| self.mark_silent(addr);
        let fetched = match super::peers::fetch_peers_noting(&self.http, &named, &mut note).await {
            Ok(p) => Ok(p),
            Err(e) if others.is_empty() => Err(e),
            Err(_) => {
                super::peers::fetch_peers_noting(self.client_for(&others[0]), &others, &mut note)
                    .await
            }
        };
        let peers = match fetched {
            Ok(p) => p,
            // A pool that grows may be at zero workers (or only at ones
            // that just left): an empty view, until one joins.
            Err(e) if self.config.growth.is_some() => {
                tracing::debug!("no worker of the growing pool answered: {e:#}");
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let peers = self.with_new_members(peers, &named).await;
        let peers = self.placeable(peers);
        view.peers = peers.clone();
        view.fetched = Some(Instant::now());
        Ok(peers)
    }

    /// Whether a growing pool's directory lists a member the cached view
    /// lacks. The directory is read at most every `MEMBERS_LOOK`: `view`
    /// is on the path of every job placed.
    fn joined_since(&self, view: &mut View) -> bool {
        let Some(growth) = &self.config.growth else {
            return false;
        };
        if view
            .members_looked
            .is_some_and(|t| t.elapsed() < MEMBERS_LOOK)
        {
            return false;
        }
        view.members_looked = Some(Instant::now());
        let silent = self.silent_members.lock();
        (growth.members)()
            .iter()
            .any(|m| !silent.contains_key(m) && !view.peers.iter().any(|p| &p.advert.addr == m))
    }

    /// Notes that `addr` did not answer: asked last (or, a new member,
    /// not at all) for `SILENT_FOR`.
    fn mark_silent(&self, addr: &str) {
        self.silent_members
            .lock()
            .insert(addr.to_string(), Instant::now());
    }

    /// A growing pool's members that `peers` (one worker's view) does not
    /// have yet, asked for their own records: a worker that just joined
    /// is in the pool directory at once but reaches the others' views only
    /// after a gossip round or two, and a map waiting for workers should
    /// not wait that long. At most [`NEW_MEMBERS_ASKED`] a time.
    async fn with_new_members(&self, mut peers: Vec<PeerView>, named: &[String]) -> Vec<PeerView> {
        let Some(growth) = &self.config.growth else {
            return peers;
        };
        let members = (growth.members)();
        let new: Vec<String> = {
            let mut silent = self.silent_members.lock();
            silent.retain(|_, since| since.elapsed() < SILENT_FOR);
            members
                .into_iter()
                .filter(|m| {
                    named.contains(m)
                        && !silent.contains_key(m)
                        && !peers.iter().any(|p| &p.advert.addr == m)
                })
                .take(NEW_MEMBERS_ASKED)
                .collect()
        };
        let asked = new.iter().map(|addr| async move {
            let api = super::api::WorkerApi::new(&self.http, addr);
            let own = tokio::time::timeout(NEW_MEMBER_PATIENCE, api.peers()).await;
            own.ok()?.ok()?.into_iter().find(|p| &p.advert.addr == addr)
        });
        let records = futures::future::join_all(asked).await;
        for (addr, record) in new.iter().zip(&records) {
            if record.is_none() {
                self.mark_silent(addr);
            }
        }
        peers.extend(records.into_iter().flatten());
        peers
    }

    /// Tells the pool what a map still has to run: to the first worker
    /// that takes it, named ones first (each is trusted with the token),
    /// then the vouched ones of the view. A report that no worker takes is
    /// said in the log and dropped: the next one replaces it.
    pub async fn report_backlog(&self, backlog: &crate::proto::backlog::Backlog) {
        if let Some(growth) = &self.config.growth {
            (growth.report)(backlog);
        }
        let seeds = self.seeds();
        let mut ask = seeds.clone();
        if let Ok(view) = self.view().await {
            ask.extend(
                view.into_iter()
                    .map(|p| p.advert.addr)
                    .filter(|a| !seeds.contains(a)),
            );
        }
        let mut last = None;
        for addr in ask.iter().filter(|a| self.trusts(a)) {
            match WorkerApi::new(&self.http, addr).post_backlog(backlog).await {
                Ok(()) => return,
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        if let Some(why) = last {
            tracing::debug!("no worker took this map's backlog report ({why})");
        }
    }

    /// The workers to try for `spec` now, best first, each with its slots;
    /// none while no live worker is known (an error once that has lasted
    /// `no_peer_patience`, tracked in `no_peer_since`).
    pub(super) async fn candidates_now(
        &self,
        spec: &JobSpec,
        no_peer_since: &mut Option<Instant>,
    ) -> Result<Vec<(String, u32)>, SubmitError> {
        let view = self
            .view()
            .await
            .map_err(|e| SubmitError::Fatal(format!("{e:#}")))?;
        let live_before = view
            .iter()
            .filter(|p| p.liveness == Liveness::Alive && !p.advert.draining)
            .count();
        let view = placement::allowing_time(view, spec.limits.timeout_ms, crate::units::now_ms())
            .map_err(|e| SubmitError::Fatal(e.to_string()))?;
        let ending_soon = live_before > 0
            && view
                .iter()
                .all(|p| p.liveness != Liveness::Alive || p.advert.draining);
        let candidates = match placement::candidates(&view, spec.limits.memory) {
            Ok(c) => {
                *no_peer_since = None;
                c
            }
            Err(placement::NoPlace::NeverFits(why)) => {
                // A pool that grows may yet get a worker large enough.
                let Some(growth) = self
                    .config
                    .growth
                    .as_ref()
                    .filter(|g| g.can_bring(spec.limits.memory))
                else {
                    return Err(SubmitError::Fatal(why));
                };
                let since = *no_peer_since.get_or_insert_with(Instant::now);
                if since.elapsed() > growth.patience {
                    return Err(SubmitError::Fatal(format!(
                        "{why}, and the pool did not grow a worker for it in {}",
                        humantime::format_duration(growth.patience)
                    )));
                }
                Vec::new()
            }
            Err(placement::NoPlace::NoLivePeer) => {
                let patience = self
                    .config
                    .growth
                    .as_ref()
                    .map_or(self.config.no_peer_patience, |g| g.patience);
                let since = *no_peer_since.get_or_insert_with(Instant::now);
                if since.elapsed() > patience {
                    let why = if ending_soon {
                        format!(
                            "every worker of the pool ends (its batch job's time is up) before a job of {} could finish",
                            humantime::format_duration(Duration::from_millis(
                                spec.limits.timeout_ms.unwrap_or(0)
                            ))
                        )
                    } else {
                        "no live worker in the pool".to_string()
                    };
                    return Err(SubmitError::Fatal(format!(
                        "{why} (waited {})",
                        humantime::format_duration(patience)
                    )));
                }
                Vec::new()
            }
        };
        Ok(self.order_by_load(candidates, &view))
    }

    /// Candidates in best-fit order, but those already holding a slot's
    /// worth of our jobs after those that do not: without this every job of
    /// a map would go to the one best-fitting worker and queue there. Each
    /// with its slots.
    pub(super) fn order_by_load(
        &self,
        candidates: Vec<String>,
        view: &[PeerView],
    ) -> Vec<(String, u32)> {
        let load = self.load.lock();
        let now = Instant::now();
        let avoid = self.avoid.lock();
        let mut out: Vec<(u32, String, u32)> = candidates
            .into_iter()
            .filter(|a| avoid.get(a).is_none_or(|until| *until <= now))
            .map(|a| {
                let slots = view
                    .iter()
                    .find(|p| p.advert.addr == a)
                    .map_or(1, |p| p.advert.slots_total.max(1));
                (load.get(&a).copied().unwrap_or(0) / slots, a, slots)
            })
            .collect();
        out.sort_by_key(|(waves, _, _)| *waves);
        out.into_iter().map(|(_, a, slots)| (a, slots)).collect()
    }

    /// Whether `addr` may be sent the tenant's token: the user named it,
    /// or it is placeable in the last view (vouched for, or certified over
    /// TLS); and it does not cross the network in clear (TLS, loopback, or
    /// `--insecure-http`).
    pub(super) fn trusts(&self, addr: &str) -> bool {
        self.http.may_send_to(addr)
            && (self.seeds().iter().any(|s| s == addr) || self.vouched.lock().contains(addr))
    }

    /// The workers the user named: the seeds, and a growing pool's members
    /// now (from the user's own pool directory).
    pub(super) fn seeds(&self) -> Vec<String> {
        let mut seeds = self.config.seeds.clone();
        if let Some(growth) = &self.config.growth {
            seeds.extend(
                (growth.members)()
                    .into_iter()
                    .filter(|m| !self.config.seeds.contains(m)),
            );
        }
        seeds
    }

    /// How the pool grows, if it does.
    pub fn growth(&self) -> Option<&super::growth::Growth> {
        self.config.growth.as_ref()
    }

    /// The workers of `peers` a job may be placed on: named, vouched for
    /// by the worker that answered, or (over TLS) certified by the pool's
    /// CA when connected to. The others are left out, each said once.
    fn placeable(&self, peers: Vec<PeerView>) -> Vec<PeerView> {
        let tls = self.config.transport.is_tls();
        let seeds = self.seeds();
        let (kept, left): (Vec<PeerView>, Vec<PeerView>) = peers
            .into_iter()
            .partition(|p| tls || p.vouched || seeds.contains(&p.advert.addr));
        let mut said = self.unvouched_said.lock();
        for p in left.iter().filter(|p| said.insert(p.advert.addr.clone())) {
            tracing::warn!(
                worker = %p.advert.addr,
                "not placing jobs on {}: no worker vouches for it (its advert did not come in gossip sealed \
                 with the pool's key) and it was not named with --peers",
                p.advert.addr
            );
        }
        *self.vouched.lock() = kept.iter().map(|p| p.advert.addr.clone()).collect();
        kept
    }

    /// The client for `addr`: with the token if it is trusted.
    pub(super) fn client_for(&self, addr: &str) -> &HttpClient {
        if self.trusts(addr) {
            &self.http
        } else {
            &self.anon
        }
    }

    /// The generation the last view gave `addr` (not asked again).
    pub(super) async fn known_generation(&self, addr: &str) -> Option<u64> {
        let view = self.view.lock().await;
        let known = view.peers.iter().find(|p| p.advert.addr == addr);
        known.map(|p| p.id.generation)
    }

    pub(super) fn add_load(&self, addr: &str, delta: i32) {
        let mut load = self.load.lock();
        let n = load.entry(addr.to_string()).or_insert(0);
        *n = n.saturating_add_signed(delta);
    }

    pub(super) fn avoid(&self, addr: &str) {
        let until = Instant::now() + self.config.avoid_for;
        self.avoid.lock().insert(addr.to_string(), until);
    }

    /// What a worker's refusal of a job means for its placement: 422 and
    /// 503 (and a token withheld) send it to the next worker; a request no
    /// worker would take is fatal.
    pub(super) fn read_refusal(
        &self,
        addr: &str,
        status: StatusCode,
        message: String,
        largest: Option<u64>,
    ) -> PeerError {
        match status {
            StatusCode::UNPROCESSABLE_ENTITY => PeerError::Declined(match largest {
                Some(b) => format!("too large here (largest {})", Bytes(b)),
                None => message, // e.g. a time limit longer than it allows
            }),
            StatusCode::UNAUTHORIZED if !self.trusts(addr) => PeerError::Declined(format!(
                "it asks for a token, which goes only to workers you name or that the pool's key \
                 vouches for: {message}"
            )),
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNAUTHORIZED => {
                PeerError::Fatal(message)
            }
            status => PeerError::Declined(format!("{status}: {message}")),
        }
    }

    /// Runs `send` (an upload of what `key` names to `addr`) for a
    /// submission sent at `sent` that found it missing — unless such an
    /// upload finished since then: the many jobs of a batch that all found
    /// it missing share one upload.
    pub(super) async fn once(
        &self,
        addr: &str,
        key: ModuleHash,
        sent: Instant,
        send: impl std::future::Future<Output = Result<(), PeerError>>,
    ) -> Result<(), PeerError> {
        let last = self
            .uploaded
            .lock()
            .entry((addr.to_string(), key))
            .or_default()
            .clone();
        let mut last = last.lock().await;
        if last.is_some_and(|at| at > sent) {
            return Ok(());
        }
        send.await?;
        *last = Some(Instant::now());
        Ok(())
    }

    /// Uploads `job`'s module to `addr` once for the submissions sent
    /// since `sent` (see [`once`](Self::once)).
    pub(super) async fn upload_once(
        &self,
        addr: &str,
        job: &Job,
        sent: Instant,
    ) -> Result<(), PeerError> {
        self.once(addr, job.hash(), sent, self.upload(addr, job))
            .await
    }

    async fn upload(&self, addr: &str, job: &Job) -> Result<(), PeerError> {
        let api = WorkerApi::new(self.client_for(addr), addr);
        match api
            .put_module(&job.hash(), bytes::Bytes::copy_from_slice(job.bytes()))
            .await
        {
            Ok(()) => Ok(()),
            Err(ApiError::Status {
                status: StatusCode::UNAUTHORIZED,
                ..
            }) if !self.trusts(addr) => Err(PeerError::Declined(
                "it asks for a token, which goes only to trusted workers".into(),
            )),
            Err(ApiError::Status {
                status:
                    s @ (StatusCode::BAD_REQUEST
                    | StatusCode::PAYLOAD_TOO_LARGE
                    | StatusCode::UNAUTHORIZED),
                message,
                ..
            }) => Err(PeerError::Fatal(format!(
                "module upload refused: {s} {message}"
            ))),
            Err(ApiError::Status { status, .. }) => Err(PeerError::Declined(format!(
                "module upload refused: {status}"
            ))),
            Err(e) => Err(e.into()),
        }
    }
}

/// Waits `backoff` with up to half of it again as jitter, then doubles it
/// (up to 250 ms): every worker declined, try again soon.
pub(super) async fn backoff_wait(backoff: &mut Duration) {
    let jitter = Duration::from_micros(rand::random_range(0..=backoff.as_micros() as u64 / 2));
    tokio::time::sleep(*backoff + jitter).await;
    *backoff = (*backoff * 2).min(Duration::from_millis(250));
}

#[cfg(test)]
mod tests;
