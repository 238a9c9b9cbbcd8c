//! What admission shows the rest of the worker at one instant
//! ([`AdmissionView`], read by `Admission::view` under one lock): its
//! adverts, and what warm starts keep (`worker::warm_charge`).

use crate::proto::TenantUsage;

/// Admission as an advert shows it, read at one instant.
#[derive(Clone, Debug)]
pub struct AdmissionView {
    /// Slots running a job.
    pub busy: u32,
    /// Jobs waiting for a slot.
    pub queued: u32,
    /// Whether a job waits that only memory keeps from starting: a slot is
    /// free, and its tenant is below its slot limit. What warm starts keep
    /// is let go for it; not for a job its tenant's limit holds back.
    pub waits_for_memory: bool,
    /// How long nothing has run or waited; `None` while something does.
    pub idle_for: Option<std::time::Duration>,
    /// Each tenant's usage here and account.
    pub tenants: Vec<TenantUsage>,
}
