//! What a map does with each answer: a result handed over (in input order,
//! or as it comes), a job run again (out of memory we estimated, lost,
//! failed within `retries`), a failure that stops the map — and how it
//! notices a submission that will never answer.

use std::time::Duration;

use super::{MapItem, MapObserver, MapRun, Stopped, input_size};
use crate::client::errors::SubmitError;
use crate::client::submitter::Submitter;
use crate::proto::{JobResult, MemoryRequest, Outcome};
use crate::units::Bytes;

impl<T: Submitter> MapRun<'_, T> {
    pub(super) fn on_answer(
        &mut self,
        id: u64,
        answer: Result<JobResult, SubmitError>,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let Some(attempt) = self.attempts.remove(&id) else {
            return Ok(());
        };
        if !attempt.abandoned {
            self.active -= 1;
        }
        let index = attempt.index;
        let learning = self.learning();
        let Some(p) = self.pending.get_mut(&index) else {
            // This input already has its result (or the map stopped before it).
            self.summary.late_answers += 1;
            return Ok(());
        };
        if !attempt.abandoned {
            p.live -= 1;
        }
        let result = match answer {
            Ok(result) => result,
            Err(SubmitError::Lost {
                peer,
                reason,
                killed,
            }) => {
                if attempt.abandoned {
                    return Ok(());
                }
                self.summary.lost += 1;
                p.lost += u32::from(killed);
                let why = format!("lost with worker {peer}: {reason}");
                return self.after_loss(index, &peer, &why, killed, observer);
            }
            Err(SubmitError::Fatal(why)) => anyhow::bail!("{why}"),
        };
        if let Some((_, sent)) = attempt.placed.get() {
            let rt = sent.elapsed();
            self.slowest_round_trip = Some(self.slowest_round_trip.map_or(rt, |s| s.max(rt)));
        }
        let ceiling = self.estimator.ceiling();
        let retry = match &result.outcome {
            Outcome::MemoryLimitExceeded {
                limit, requested, ..
            } if learning && result.ran_out_of_lent_memory() => {
                // It did not reach its limit: its worker had nothing more to
                // lend past its reserve. Nothing is learned of its need; it
                // runs again with its whole request reserved.
                p.memory_retries += 1;
                p.floor = MemoryRequest::from(result.memory_limit_bytes);
                self.summary.memory_retries += 1;
                self.summary.lend_retries += 1;
                Some(format!(
                    "outgrew its reserve and its worker had no more memory to lend past {} \
                     (asked for {}); again with {} reserved whole",
                    Bytes(*limit),
                    Bytes(*requested),
                    p.floor
                ))
            }
            Outcome::MemoryLimitExceeded {
                limit, requested, ..
            } if learning && *limit < ceiling => {
                let outgrown = crate::client::estimate::Outgrown {
                    limit: *limit,
                    requested: *requested,
                    first: p.memory_retries == 0,
                };
                p.memory_retries += 1;
                p.floor = self.estimator.retry(input_size(p), outgrown);
                self.summary.memory_retries += 1;
                Some(format!("{}; again with {}", result.outcome, p.floor))
            }
            outcome if !outcome.is_success() && p.retries_used < self.config.retries => {
                p.retries_used += 1;
                self.summary.failure_retries += 1;
                Some(format!(
                    "{outcome}; retry {} of {}",
                    p.retries_used, self.config.retries
                ))
            }
            _ => None,
        };
        if let Some(why) = retry {
            // A peak cut short by the limit says only "more": not learned.
            if result.peak_memory_bytes > 0
                && !matches!(result.outcome, Outcome::MemoryLimitExceeded { .. })
            {
                self.estimator
                    .observe(input_size(p), result.peak_memory_bytes);
            }
            observer.retry(index, &why);
            if p.live == 0 {
                self.resubmit.push_front(index);
            }
            return Ok(());
        }
        self.complete(index, result, observer)
    }

    /// After `index` was lost with `peer` (`killed`: the process running
    /// it died, counted in its `lost`): submitted again once nothing else
    /// of it is under way, or given up — ended with outcome `lost` — when
    /// the process running it died for the `max_lost`-th time.
    fn after_loss(
        &mut self,
        index: usize,
        peer: &str,
        why: &str,
        killed: bool,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let Some(p) = self.pending.get(&index) else {
            return Ok(());
        };
        if p.live > 0 {
            // Another submission of it may still answer.
            observer.retry(index, why);
            return Ok(());
        }
        if p.lost < self.config.max_lost || !killed {
            observer.retry(index, why);
            self.resubmit.push_back(index);
            return Ok(());
        }
        let reason = format!(
            "lost {} times with the process running it, the last: {why}; not run again \
             (a job that ends whatever runs it fails rather than go round the pool: max_lost {})",
            p.lost, self.config.max_lost
        );
        let mut result =
            JobResult::never_ran(self.request(index).bytes(), Outcome::Lost { reason });
        result.peer = peer.to_string();
        self.complete(index, result, observer)
    }

    pub(super) fn complete(
        &mut self,
        index: usize,
        mut result: JobResult,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let Some(p) = self.pending.remove(&index) else {
            return Ok(());
        };
        if p.attempts > 1 {
            self.cancel_attempts_of(index);
        }
        if !result.files.is_empty() {
            // Small (a worker sends back at most --max-files-back), so
            // written here, as each job ends.
            let out = self
                .config
                .out_dir
                .as_ref()
                .map(|o| o.join(index.to_string()));
            crate::client::tree::write_back(&self.job.dirs, &mut result.files, out.as_deref())
                .map_err(|e| {
                    anyhow::anyhow!("input {index}: cannot write the files it made: {e:#}")
                })?;
        }
        let s = &mut self.summary;
        s.jobs += 1;
        s.cpu_time += Duration::from_micros(result.cpu_time_us);
        *s.per_peer.entry(result.peer.clone()).or_default() += 1;
        s.warned += u64::from(!result.warnings.is_empty());
        self.wall_sum_us += result.wall_time_us as u128;
        if (result.peak_memory_bytes > 0 || result.outcome.is_success())
            && !matches!(result.outcome, Outcome::MemoryLimitExceeded { .. })
        {
            self.estimator
                .observe(input_size(&p), result.peak_memory_bytes);
        }
        let item = MapItem {
            index,
            result,
            attempts: p.attempts,
            reserve: p.reserve,
        };
        if !item.succeeded() {
            s.failed += 1;
            if !self.config.keep_going && self.stop.as_ref().is_none_or(|st| index < st.index) {
                self.stop = Some(Stopped {
                    index,
                    message: item.failure_message(),
                });
                self.cut_after(index);
            }
        }
        if !self.config.ordered {
            // As it arrives; past a stop, only what the stop lets through.
            if self.stop.as_ref().is_none_or(|st| index <= st.index) {
                observer.result(item)?;
            }
            observer.progress(&self.progress());
            return Ok(());
        }
        self.ready.insert(index, item);
        while let Some(item) = self.ready.remove(&self.next_emit) {
            if self.stop.as_ref().is_some_and(|st| item.index > st.index) {
                break;
            }
            observer.result(item)?;
            self.next_emit += 1;
        }
        observer.progress(&self.progress());
        Ok(())
    }

    /// Cancels every submission of `index` still under way (it has its
    /// result): dropped, its job is cancelled where it runs.
    fn cancel_attempts_of(&mut self, index: usize) {
        let mut active = self.active;
        self.attempts.retain(|_, a| {
            if a.index != index {
                return true;
            }
            a.abort.abort();
            active -= usize::from(!a.abandoned);
            false
        });
        self.active = active;
    }

    /// After a failure at `index` stops the map: nothing after it runs on.
    pub(super) fn cut_after(&mut self, index: usize) {
        self.pending.retain(|&i, _| i <= index);
        self.resubmit.retain(|&i| i <= index);
        self.staged.retain(|&i| i <= index);
        self.ready.retain(|&i, _| i <= index);
        for a in self
            .attempts
            .values_mut()
            .filter(|a| a.index > index && !a.abandoned)
        {
            a.abort.abort();
            a.abandoned = true;
            self.active -= 1;
        }
    }

    /// Gives up on submissions whose worker the pool calls dead (a loss,
    /// counted), and sends one copy of an input whose submission is far
    /// slower than any answer so far (not counted: its first submission
    /// goes on, and whichever answers first is used).
    pub(super) async fn check_lost(
        &mut self,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        if self.attempts.is_empty() {
            return Ok(());
        }
        let dead = self.target.dead_workers().await;
        let deadline = self
            .slowest_round_trip
            .map(|rt| 3 * rt + self.config.lost_slack);
        let mut lost = Vec::new();
        for (id, a) in &self.attempts {
            if a.abandoned {
                continue;
            }
            let Some((peer, sent)) = a.placed.get() else {
                continue;
            };
            if dead.contains(&peer) {
                lost.push((
                    *id,
                    peer.clone(),
                    format!("worker {peer} was declared dead"),
                    true,
                ));
            } else if deadline.is_some_and(|d| sent.elapsed() > d)
                && self.pending.get(&a.index).is_some_and(|p| !p.copied)
            {
                let waited = sent.elapsed().as_secs_f64();
                let why =
                    format!("no answer from {peer} in {waited:.1} s: one copy sent elsewhere");
                lost.push((*id, peer, why, false));
            }
        }
        for (id, peer, why, killed) in lost {
            let Some(a) = self.attempts.get_mut(&id) else {
                continue;
            };
            if a.abandoned {
                continue;
            }
            a.abandoned = true;
            self.active -= 1;
            let index = a.index;
            let Some(p) = self.pending.get_mut(&index) else {
                continue;
            };
            p.live -= 1;
            if killed {
                p.lost += 1;
                self.summary.lost += 1;
                self.after_loss(index, &peer, &why, true, observer)?;
            } else {
                p.copied = true;
                self.summary.lost += 1;
                observer.retry(index, &why);
                if p.live == 0 {
                    self.resubmit.push_back(index);
                }
            }
        }
        Ok(())
    }
}
