//! Whether a job whose connection broke was lost with its worker
//! ([`Pool::judge_broken`]): what a map counts against `max_lost`.
//!
//! Why: a map gives up an input lost `max_lost` times with the process
//! running it, so that a job that kills whatever runs it does not go round
//! the pool for ever. A broken connection says only that *something*
//! between the client and the job went away: the worker's process (which
//! the job may have ended: counted), or the network — the worker's, or
//! this client's own (a laptop closed, a Wi-Fi that changed, a VPN that
//! dropped), which says nothing about the job. Counting those, three
//! network blips would have given up every input in flight. So the worker
//! is asked whether it is still there: one that answers as the same
//! process (its generation unchanged) lost only a connection; one that does
//! not answer while another worker does, or answers as a new process (a
//! supervisor restarted it), is gone (counted); and when no worker answers,
//! this client is the one cut off (not counted). Either way the input runs
//! again.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::api::WorkerApi;
use super::errors::Broken;
use super::pool::Pool;
use crate::gossip::Liveness;

/// How long a worker may take to answer whether it is there.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Other workers asked, when the lost one does not answer, whether this
/// client still reaches the pool.
const OTHERS_ASKED: usize = 3;

impl Pool {
    /// After the connection to `addr` broke under a job: whether the worker
    /// is gone, still there, or whether nobody answers (see the module
    /// docs).
    ///
    /// Many connections to one worker break together — one batch's
    /// connection, one worker's death, this client's network — and each of
    /// their jobs asks: they share the probe in flight for that worker,
    /// rather than send a thousand probes into a dead network. A probe
    /// that has answered is not reused: a later break is asked afresh.
    pub(crate) async fn judge_broken(&self, addr: &str) -> Broken {
        let probe = {
            let mut probes = self.probes.lock();
            probes.retain(|_, p| p.get().is_none());
            probes.entry(addr.to_string()).or_default().clone()
        };
        let verdict = probe.get_or_init(|| self.probe(addr)).await.clone();
        // Let go of the answered probe (it stays only while in flight).
        let mut probes = self.probes.lock();
        if probes.get(addr).is_some_and(|p| Arc::ptr_eq(p, &probe)) {
            probes.remove(addr);
        }
        verdict
    }

    /// One probe of `addr` and, when it does not answer, of others.
    async fn probe(&self, addr: &str) -> Broken {
        let before = self.known_generation(addr).await;
        match self.ask(addr).await {
            // Another process on its address: it restarted (a supervisor
            // brought it back) since the job was sent.
            Some(Some(now)) if before.is_some_and(|b| b != now) => return Broken::WorkerGone,
            Some(_) => return Broken::WorkerAnswers,
            None => {}
        }
        let mut others: Vec<String> = Vec::new();
        let alive = match self.view().await {
            Ok(view) => view
                .into_iter()
                .filter(|p| p.liveness == Liveness::Alive)
                .map(|p| p.advert.addr)
                .collect(),
            Err(_) => Vec::new(),
        };
        for other in self.seeds().into_iter().chain(alive) {
            if other != addr && !others.contains(&other) {
                others.push(other);
            }
        }
        let mut asked: futures::stream::FuturesUnordered<_> = others
            .iter()
            .take(OTHERS_ASKED)
            .map(|o| self.ask(o))
            .collect();
        while let Some(answered) = asked.next().await {
            if answered.is_some() {
                return Broken::WorkerGone;
            }
        }
        Broken::NobodyAnswers
    }

    /// Whether `addr` answers at all within [`PROBE_TIMEOUT`] (`None` if
    /// not; any status is an answer), with the generation it gives itself
    /// when it sends its view.
    async fn ask(&self, addr: &str) -> Option<Option<u64>> {
        let api = WorkerApi::new(self.client_for(addr), addr);
        match tokio::time::timeout(PROBE_TIMEOUT, api.peers()).await {
            Ok(Ok(view)) => Some(
                view.iter()
                    .find(|p| p.advert.addr == addr)
                    .map(|p| p.id.generation),
            ),
            Ok(Err(super::api::ApiError::Transport { .. })) | Err(_) => None,
            Ok(Err(_)) => Some(None),
        }
    }
}
