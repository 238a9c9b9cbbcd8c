//! The hostile module corpus, run on a real worker process over HTTP: each
//! case must end with its documented outcome and one clear message, and the
//! worker must stay up and run an ordinary job right after it.
//!
//! The expectations live in `docs/hostile-corpus.md` (a table: case,
//! outcome, what the message says): this test reads that table and checks
//! every row against what the worker really did, so the document cannot
//! drift from the code.

use std::collections::BTreeMap;

use peerwasm::client::{Job, SubmitError, Target};
use peerwasm::proto::{JobResult, Outcome};

use crate::support::{MIB, WorkerProcess};

const WASI: &str = "wasi_snapshot_preview1";

/// A case's module: a built guest (a core module, or a wasip2 component),
/// WAT text, or raw bytes.
enum Module {
    Guest(&'static str),
    Component(&'static str),
    Wat(String),
    Bytes(Vec<u8>),
}

struct Case {
    name: &'static str,
    module: Module,
    stdin: &'static str,
    mem: u64,
    timeout_ms: Option<u64>,
}

fn case(name: &'static str, module: Module) -> Case {
    Case {
        name,
        module,
        stdin: "",
        mem: 64 * MIB,
        timeout_ms: Some(2000),
    }
}

/// `_start` calls `proc_exit(code)`.
fn proc_exit(code: u32) -> Module {
    Module::Wat(format!(
        r#"(module (import "{WASI}" "proc_exit" (func $exit (param i32)))
             (memory (export "memory") 1)
             (func (export "_start") (call $exit (i32.const {code}))))"#
    ))
}

/// `_start` writes 64 KiB to `fd` without end.
fn flood(fd: u32) -> Module {
    Module::Wat(format!(
        r#"(module (import "{WASI}" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
             (memory (export "memory") 2)
             ;; one iovec at 0: buffer at 1024, 65536 bytes
             (data (i32.const 0) "\00\04\00\00\00\00\01\00")
             (func (export "_start")
               (loop (drop (call $w (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 16))) (br 0))))"#
    ))
}

fn corpus() -> Vec<Case> {
    let hello = peerwasm_testkit::guest_wasm_bytes("hello");
    let mut random = vec![0u8; 4096];
    random
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i as u32).wrapping_mul(2654435761).to_le_bytes()[3]);
    let mut oversized = b"\0asm\x01\0\0\0".to_vec();
    oversized.resize(peerwasm::sandbox::DEFAULT_MAX_MODULE_BYTES as usize + 1, 0);
    vec![
        case("infinite loop", Module::Wat(r#"(module (func (export "_start") (loop (br 0))))"#.into())),
        case(
            "loop calling a host function",
            Module::Wat(format!(
                r#"(module (import "{WASI}" "clock_time_get" (func $t (param i32 i64 i32) (result i32)))
                     (memory (export "memory") 1)
                     (func (export "_start") (loop (drop (call $t (i32.const 0) (i64.const 0) (i32.const 64))) (br 0))))"#
            )),
        ),
        case("unbounded memory growth", Module::Guest("hostile-grow")),
        case(
            "one huge memory.grow",
            Module::Wat(
                r#"(module (memory 1)
                     (func (export "_start")
                       (if (i32.eq (memory.grow (i32.const 65535)) (i32.const -1)) (then unreachable))))"#
                    .into(),
            ),
        ),
        case("4 GiB initial memory", Module::Wat(r#"(module (memory 65536) (func (export "_start")))"#.into())),
        case("unbounded recursion", Module::Guest("hostile-recurse")),
        case(
            "table growth bomb",
            Module::Wat(
                r#"(module (table 1 funcref)
                     (func (export "_start")
                       (if (i32.eq (table.grow (ref.null func) (i32.const 100000000)) (i32.const -1))
                         (then unreachable))))"#
                    .into(),
            ),
        ),
        case("module over the size cap (128 MiB + 1)", Module::Bytes(oversized)),
        case("20,000 functions (6 MB; compile-time bomb within the cap)", Module::Bytes(peerwasm_testkit::big_module(20_000))),
        case("stdout flood", Module::Guest("hostile-flood")),
        case("stderr flood", flood(2)),
        case("escape from /tmp: .., absolute paths, planted symlinks", Module::Guest("hostile-escape")),
        case("proc_exit(3)", Module::Guest("hostile-exit")),
        case("proc_exit(125)", proc_exit(125)),
        case("proc_exit(126)", proc_exit(126)),
        case("proc_exit(4294967295)", proc_exit(u32::MAX)),
        case(
            "an import we do not provide",
            Module::Wat(r#"(module (import "env" "launch_missiles" (func)) (func (export "_start")))"#.into()),
        ),
        case("no _start", Module::Wat(r#"(module (func (export "main")))"#.into())),
        case("an empty component (a header, no wasi:cli/run)", Module::Bytes(b"\0asm\x0d\0\x01\0".to_vec())),
        case(
            "a component importing an interface we do not provide",
            Module::Wat(r#"(component (import "example:launch/missiles" (instance (export "fire" (func)))))"#.into()),
        ),
        case(
            "a component importing a WASI interface we do not implement",
            Module::Wat(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance (export "fire" (func)))))"#.into()),
        ),
        case("a component that wants the network (wasi:sockets)", Module::Component("net")),
        case("a component computing forever", Module::Component("hostile-loop")),
        case("a component growing its memory without end", Module::Component("hostile-grow")),
        case("a component recursing without end", Module::Component("hostile-recurse")),
        case("a component flooding stdout", Module::Component("hostile-flood")),
        case("random bytes", Module::Bytes(random)),
        case("a truncated module", Module::Bytes(hello[..hello.len() / 2].to_vec())),
        case("descriptor bomb: open files without end", Module::Guest("hostile-files")),
        case("disk filler: a tree 64 deep, then writes without end", Module::Guest("hostile-disk")),
    ]
}

/// The outcome as the corpus table names it.
fn outcome_label(r: &Result<JobResult, SubmitError>) -> String {
    match r {
        Ok(r) => match &r.outcome {
            Outcome::Exited { code } => format!("exited {code}"),
            Outcome::MemoryLimitExceeded { .. } => "memory limit".into(),
            Outcome::TimeLimitExceeded { .. } => "time limit".into(),
            Outcome::OutputLimitExceeded { .. } => "output limit".into(),
            Outcome::Trapped { .. } => "trap".into(),
            Outcome::InvalidModule { .. } => "invalid module".into(),
            Outcome::Rejected { .. } => "rejected".into(),
            Outcome::OutputMemoryExhausted { .. } => "output memory".into(),
            Outcome::Cancelled { .. } => "cancelled".into(),
            Outcome::FilesBackTooLarge { .. } => "files back too large".into(),
            Outcome::Lost { .. } => "lost".into(),
        },
        Err(SubmitError::Fatal(_)) => "refused".into(),
        Err(SubmitError::Lost { .. }) => "lost".into(),
    }
}

/// The one message a user sees: the outcome (or the refusal).
fn message(r: &Result<JobResult, SubmitError>) -> String {
    match r {
        Ok(r) => r.outcome.to_string(),
        Err(e) => e.to_string(),
    }
}

/// The rows of the table in docs/hostile-corpus.md: case → (outcome,
/// message contains, stdout contains).
fn documented() -> BTreeMap<String, (String, String, String)> {
    let path = peerwasm_testkit::workspace_root().join("docs/hostile-corpus.md");
    let text = std::fs::read_to_string(&path).expect("docs/hostile-corpus.md");
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| case") && !l.starts_with("|---"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace('`', ""))
                .collect();
            assert!(
                cells.len() >= 4,
                "a corpus row needs case | outcome | message | stdout: {l}"
            );
            (
                cells[0].clone(),
                (cells[1].clone(), cells[2].clone(), cells[3].clone()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_hostile_case_gets_its_documented_outcome_and_the_worker_keeps_serving() {
    corpus_on(&[]).await;
}

/// The same corpus with every job's code run in a slot process (no fuel;
/// ended from outside): the same outcomes, and the worker goes on.
#[tokio::test(flavor = "multi_thread")]
async fn every_hostile_case_gets_its_documented_outcome_in_a_slot_process_too() {
    corpus_on(&["--slot-processes", "always"]).await;
}

async fn corpus_on(extra: &[&str]) {
    let mut args = vec!["--scratch", "64MiB"];
    args.extend_from_slice(extra);
    let mut worker = WorkerProcess::start_with("1GiB", 2, None, &args);
    let target = Target::pool(vec![worker.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let docs = documented();
    let cases = corpus();
    let mut observed = Vec::new();
    let mut wrong = Vec::new();
    for c in &cases {
        let bytes = match &c.module {
            Module::Guest(name) => peerwasm_testkit::guest_wasm_bytes(name),
            Module::Component(name) => {
                std::fs::read(peerwasm_testkit::guest_component_wasm(name)).unwrap()
            }
            Module::Wat(text) => wat::parse_str(text).unwrap(),
            Module::Bytes(b) => b.clone(),
        };
        let mut job = Job::new(bytes);
        job.limits.timeout_ms = c.timeout_ms;
        job.limits.stdout_bytes = MIB;
        job.limits.stderr_bytes = MIB;
        let result = target
            .run(&job, job.spec(c.stdin.as_bytes().to_vec(), c.mem))
            .await;
        let (label, msg) = (outcome_label(&result), message(&result));
        observed.push(format!(
            "| {} | {label} | {} |",
            c.name,
            msg.lines().next().unwrap_or("").trim()
        ));
        match docs.get(c.name) {
            None => wrong.push(format!("{}: not in docs/hostile-corpus.md", c.name)),
            Some((outcome, contains, printed)) => {
                let stdout = result
                    .as_ref()
                    .map(|r| String::from_utf8_lossy(&r.stdout).into_owned())
                    .unwrap_or_default();
                if *outcome != label
                    || !msg.replace('`', "").contains(contains.as_str())
                    || !stdout.contains(printed.as_str())
                {
                    wrong.push(format!(
                        "{}: documented {outcome:?} / {contains:?} / stdout {printed:?}, got {label:?}: {msg} / stdout {stdout:?}",
                        c.name
                    ));
                }
            }
        }
        // The worker is still up and serves the next job.
        assert!(
            worker.child.try_wait().unwrap().is_none(),
            "the worker died after {:?}",
            c.name
        );
        let next = target.run(&hello, hello.spec(Vec::new(), 16 * MIB)).await;
        assert!(
            matches!(&next, Ok(r) if r.outcome.is_success()),
            "the worker did not run an ordinary job after {:?}: {next:?}",
            c.name
        );
    }
    // Nothing the escape case tried to write exists on the host.
    for path in [
        "/escaped-by-peerwasm-guest",
        "/tmp/escaped-by-peerwasm-guest",
    ] {
        assert!(
            !std::path::Path::new(path).exists(),
            "a guest wrote {path} on the host"
        );
    }
    for name in docs.keys() {
        if !cases.iter().any(|c| c.name == name) {
            wrong.push(format!("{name}: documented but not in the corpus"));
        }
    }
    println!("observed:\n{}", observed.join("\n"));
    assert!(
        wrong.is_empty(),
        "the corpus disagrees with docs/hostile-corpus.md:\n{}",
        wrong.join("\n")
    );
    let _ = &mut worker;
}
