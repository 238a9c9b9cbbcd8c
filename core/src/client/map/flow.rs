//! How much of a map is under way, and which input goes next: the window
//! (Little's law over the pool as it is now, followed every
//! [`BACKLOG_EVERY`](crate::proto::backlog::BACKLOG_EVERY)), the backlog
//! the pool is told, and the order inputs are launched in.

use tokio::time::Instant;

use super::{LOOKAHEAD, MAX_IN_FLIGHT_PER_SLOT, MapRun, PIPELINE_DEPTH};
use crate::client::submitter::Submitter;
use crate::proto::backlog::Backlog;

impl<T: Submitter> MapRun<'_, T> {
    /// Reads the pool's capacity again, every tick (a pool's view is
    /// fetched at most every `PoolConfig::view_max_age`, so most reads are
    /// answered from it): a worker that joined gets work from the next
    /// launch on — a growing pool's new members within a tick or two —
    /// one that left or drains none, placement skips it.
    pub(super) async fn follow_pool(&mut self) {
        if let Ok(c) = self.target.capacity().await
            && c.workers > 0
            && c.slots > 0
        {
            self.slots = c.slots;
            self.workers = c.workers;
            self.largest_job = c.largest_job;
            self.typical_job = c.typical_job;
            self.estimator
                .set_caps(c.largest_job, c.largest_beside_warm);
            if self.config.max_in_flight.is_none() {
                self.max_in_flight = 2 * c.slots as usize;
            }
        }
    }

    /// Reports the backlog to the pool, without waiting for the report (a
    /// slow worker must not stall the map).
    pub(super) fn report_backlog(&mut self) {
        self.last_report = Some(Instant::now());
        if self.reporting.as_ref().is_none_or(|r| r.is_finished()) {
            let (target, backlog) = (self.target.clone(), self.backlog());
            self.reporting = Some(tokio::spawn(
                async move { target.report_backlog(backlog).await },
            ));
        }
    }

    /// What this map still has to run, as the pool is told it.
    pub(super) fn backlog(&self) -> Backlog {
        let unread = self.total.map_or(0, |t| t.saturating_sub(self.read as u64));
        let waiting = self.pending.values().filter(|p| p.live == 0).count();
        let memory = self.request(usize::MAX).bytes();
        // Over every input without a result, under way too: one whose
        // submission waits for a worker that can hold it (none can yet) is
        // under way, and is what a controller must grow for.
        let largest = self
            .pending
            .keys()
            .map(|&i| self.request(i).bytes())
            .max()
            .unwrap_or(0)
            .max(memory);
        Backlog {
            id: self.id.clone(),
            waiting: waiting as u64 + unread,
            running: self.active as u64,
            memory_bytes: memory,
            largest_bytes: largest,
            job_ms: if self.summary.jobs == 0 {
                0
            } else {
                (self.wall_sum_us / self.summary.jobs as u128 / 1000) as u64
            },
        }
    }

    /// How many submissions may be under way: `--max-in-flight`, else
    /// enough to keep [`PIPELINE_DEPTH`] of work per slot under way once
    /// job times are known (two per slot before; before anything of the
    /// jobs' memory is known, as many as the pool can run at the starting
    /// request).
    pub(super) fn in_flight_limit(&self) -> usize {
        if self.config.max_in_flight.is_some() {
            return self.max_in_flight;
        }
        if self.target.in_process() {
            // No round trip to cover: one submission per slot. Then the
            // embedded worker never queues one, and inputs start in input
            // order — queued submissions race to its slots, and a later,
            // slow one could take a slot before an earlier one, holding
            // back an ordered map's first result.
            return self.slots.max(1) as usize;
        }
        if self.learning() && !self.estimator.learned() && self.estimator.model().is_none() {
            // Nothing learned yet: every job goes out at the starting
            // request (1 GiB, capped by the pool). More in flight than the
            // pool can run at that request only queues jobs that have
            // already asked for too much; the first results set the rest.
            let fit_at_start = (self.largest_job / self.estimator.request().bytes().max(1)).max(1);
            return (self.workers as u64 * fit_at_start).min(2 * self.slots.max(1) as u64) as usize;
        }
        let per_slot = if self.summary.jobs == 0 {
            2
        } else {
            let mean_us = (self.wall_sum_us / self.summary.jobs as u128).max(1);
            (PIPELINE_DEPTH.as_micros() / mean_us).clamp(2, MAX_IN_FLIGHT_PER_SLOT as u128) as usize
        };
        per_slot * self.slots.max(1) as usize
    }

    /// How many inputs read but not launched the next launch chooses
    /// from: with requests sized per input (a learned by-size model, or
    /// `mem_per_input`), enough to launch the largest first (longest-processing-time first: a large job
    /// started last holds the map's end while it waits for room); else one
    /// (input order).
    pub(super) fn lookahead(&self) -> usize {
        let by_size = matches!(
            self.estimator.model(),
            Some(crate::client::estimate::Model::BySize { .. })
        );
        if self.config.mem_per_input.is_some() || (self.learning() && by_size) {
            LOOKAHEAD
        } else {
            1
        }
    }

    /// The staged input to launch next: the one asking for most (see
    /// [`lookahead`](Self::lookahead)), ties to the earliest.
    pub(super) fn next_staged(&mut self) -> Option<usize> {
        let at = (0..self.staged.len()).max_by_key(|&k| {
            let i = self.staged[k];
            (self.request(i).bytes(), std::cmp::Reverse(i))
        })?;
        Some(self.staged.remove(at))
    }

    /// Whether input `next_index` may be read: ordered, it lies within
    /// `reorder_window` of the oldest result its reader has not taken
    /// (`unread` of those handed over, before the next to hand over);
    /// unordered, fewer than `reorder_window` inputs are read and not done
    /// or done and not taken.
    pub(super) fn within_window(&self, next_index: usize, unread: usize) -> bool {
        if self.config.ordered {
            next_index + unread < self.next_emit + self.config.reorder_window
        } else {
            self.pending.len() + unread < self.config.reorder_window
        }
    }
}
