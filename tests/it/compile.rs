//! A compile's memory, outside any job's limit: read off the compile child
//! while it runs (the worker charges what it reads) and learned for the
//! next compile's estimate — with the real `peerwasm compile-child`.

use std::time::Duration;

use peerwasm::proto::ModuleHash;
use peerwasm::sandbox::compile_memory::DEFAULT_BYTES_PER_BYTE;
use peerwasm::sandbox::{CompileProgram, Sandbox, SandboxConfig};

use crate::support::{MIB, PEERWASM};

#[test]
fn a_compile_apart_is_measured_while_it_runs_and_teaches_the_estimate() {
    let sandbox = Sandbox::new(SandboxConfig {
        compile_program: Some(CompileProgram {
            exe: PEERWASM.into(),
            args: vec!["compile-child".into()],
        }),
        slots: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let big = peerwasm_testkit::big_module(20_000);
    let (hash, len) = (ModuleHash::of(&big), big.len() as u64);
    let memory = sandbox.compile_memory();
    assert_eq!(
        memory.estimate(len),
        len * DEFAULT_BYTES_PER_BYTE,
        "nothing measured yet"
    );
    assert_eq!(memory.live(&hash), None);
    let seen = std::thread::scope(|s| {
        let compiling = s.spawn(|| sandbox.load(&hash, &big));
        let mut seen = 0;
        while !compiling.is_finished() {
            seen = seen.max(memory.live(&hash).unwrap_or(0));
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(compiling.join().unwrap().is_ok(), "it compiles");
        seen
    });
    // A child running wasmtime's compiler holds megabytes; read as it ran.
    assert!(
        seen > 8 * MIB,
        "the compile's resident memory was read while it ran: {seen}"
    );
    assert_eq!(memory.live(&hash), None, "not once it ended");
    assert_eq!(memory.measured(), 1);
    // Learned: the next module of this size is expected to take what this
    // one peaked at (whole bytes per module byte), not the default guess.
    let learned = memory.estimate(len);
    assert!(learned >= seen, "{learned} < {seen}");
    assert!(
        learned < len * 4 * DEFAULT_BYTES_PER_BYTE,
        "{} MiB for a {} KiB module",
        learned / MIB,
        len >> 10
    );
}
