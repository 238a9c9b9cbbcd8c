/// `peerwasm worker` with no flags is the library's documented
/// defaults: every default is written once, as a constant, and read
/// by both.
#[test]
fn flag_defaults_are_the_library_defaults() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        worker: super::WorkerArgs,
    }
    let a = <Cli as clap::Parser>::parse_from(["peerwasm-worker"]).worker;
    let lib = crate::server::WorkerConfig::new("127.0.0.1:0".parse().unwrap());
    let sandbox = &lib.runner.sandbox;
    assert_eq!(a.reserve.0, lib.ledger.reserve);
    assert_eq!(a.memory, lib.ledger.memory);
    assert_eq!(a.gossip_interval.0, lib.gossip_interval);
    assert_eq!(a.usage_half_life.0, lib.usage_half_life);
    assert_eq!(a.hold_after.0, lib.hold_after);
    assert_eq!(a.fair_share, lib.fair_share);
    assert_eq!(a.max_queued_bytes.0, lib.max_queued_bytes);
    assert_eq!(a.max_queued, lib.max_queued);
    assert_eq!(a.drain_grace.0, lib.drain_grace);
    assert_eq!(a.max_results.0, lib.max_results);
    assert_eq!(a.max_stored.0, lib.max_stored);
    assert_eq!(a.file_store.0, lib.file_store_bytes);
    assert_eq!(a.max_files_back.0, lib.max_files_back);
    assert_eq!(a.header_timeout.0, lib.serve.header_timeout);
    assert_eq!(a.max_connections, lib.serve.max_connections);
    assert_eq!(
        std::time::Duration::from_secs(u64::from(a.history_days) * 24 * 3600),
        lib.history_keep
    );
    assert_eq!(a.keep_results.0, lib.keep_results);
    assert_eq!(Some(crate::worker::default_host_ledger()), lib.host_ledger);
    assert_eq!(a.module_memory.0, sandbox.module_bytes_held);
    assert_eq!(a.max_module_size.0, sandbox.max_module_bytes);
    assert_eq!(a.cache_max.0, sandbox.cache_max_bytes);
    assert_eq!(Some(a.scratch.0), sandbox.max_scratch_bytes);
    assert_eq!(Some(a.max_output.0), sandbox.max_output_bytes);
    assert_eq!(Some(a.max_compile_time.0), sandbox.max_compile_time);
    assert_eq!(a.max_job_time.0, sandbox.max_job_time);
    assert_eq!(a.max_open_files, sandbox.max_open_files);
    let admission = crate::worker::admission::AdmissionConfig::new(1);
    assert_eq!(
        (admission.half_life, admission.hold_after),
        (lib.usage_half_life, lib.hold_after)
    );
    assert_eq!(admission.queue_bytes_per_tenant, lib.max_queued_bytes);
}
