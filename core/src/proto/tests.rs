use super::*;

/// Byte fields are postcard bytes, which encode exactly as the byte
/// sequences peers of this protocol version send: nothing changes on
/// the wire.
#[test]
fn byte_fields_encode_as_byte_sequences_did() {
    #[derive(Serialize)]
    struct AsSequence<'a> {
        stdout: &'a [u8],
        stderr: Vec<u8>,
        ended: Option<Outcome>,
        run: u64,
    }
    let out = JobOutput {
        stdout: (0..=255).collect(),
        stderr: b"err".to_vec(),
        ended: None,
        run: 7,
    };
    let seq = AsSequence {
        stdout: &out.stdout,
        stderr: out.stderr.clone(),
        ended: None,
        run: 7,
    };
    let (bytes, seq_bytes) = (
        postcard::to_allocvec(&out).unwrap(),
        postcard::to_allocvec(&seq).unwrap(),
    );
    assert_eq!(bytes, seq_bytes);
    assert_eq!(postcard::from_bytes::<JobOutput>(&seq_bytes).unwrap(), out);
    let spec = JobSpec {
        stdin: vec![7; 100_000],
        ..JobSpec::new(ModuleHash([1; 32]))
    };
    assert_eq!(
        postcard::from_bytes::<JobSpec>(&postcard::to_allocvec(&spec).unwrap()).unwrap(),
        spec
    );
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(
        serde_json::from_str::<JobSpec>(&json).unwrap(),
        spec,
        "JSON still reads"
    );
}

/// A spec a worker of protocol 4 stored (no `invoke`) or of protocol 9
/// (no `warm`) still decodes from its database; a spec of today
/// round-trips.
#[test]
fn specs_stored_by_protocol_4_still_decode() {
    #[derive(Serialize)]
    struct SpecV4<'a> {
        module: ModuleHash,
        program_name: &'a str,
        args: Vec<String>,
        env: Vec<(String, String)>,
        #[serde(with = "serde_bytes")]
        stdin: Vec<u8>,
        dirs: Vec<DirGrant>,
        trees: Vec<tree::TreeGrant>,
        limits: JobLimits,
        tag: Option<submission::JobTag>,
    }
    let old = SpecV4 {
        module: ModuleHash([3; 32]),
        program_name: "p.wasm",
        args: vec!["a".into()],
        env: vec![("K".into(), "V".into())],
        stdin: b"in".to_vec(),
        dirs: Vec::new(),
        trees: Vec::new(),
        limits: JobLimits::default(),
        tag: Some(submission::JobTag {
            submission: "s".into(),
            index: 4,
            attempt: 1,
        }),
    };
    let spec = JobSpec::from_stored(&postcard::to_allocvec(&old).unwrap()).unwrap();
    assert_eq!(
        (
            spec.args.as_slice(),
            spec.invoke.as_deref(),
            spec.tag.as_ref().map(|t| t.index)
        ),
        (&["a".to_string()][..], None, Some(4))
    );
    let now = JobSpec {
        invoke: Some("run".into()),
        ..spec
    };
    let stored = now.to_stored().unwrap();
    assert_eq!(JobSpec::from_stored(&stored).unwrap(), now);
    // Protocol 10 kept its wire form, `dirs` and all; protocol 9 the same
    // bytes less its `warm: None`.
    #[derive(Serialize)]
    struct SpecV10<'a> {
        v4: SpecV4<'a>,
        invoke: Option<&'a str>,
        warm: Option<WarmStart>,
    }
    let v10 = postcard::to_allocvec(&SpecV10 {
        v4: old,
        invoke: Some("run"),
        warm: None,
    })
    .unwrap();
    assert_eq!(JobSpec::from_stored(&v10).unwrap(), now);
    assert_eq!(JobSpec::from_stored(&v10[..v10.len() - 1]).unwrap(), now);
    // Protocol 11 kept `pws1` and the spec less its last field,
    // `memory_reserve`: it reads as none.
    let v11 = now.to_stored().unwrap();
    assert_eq!(v11.last(), Some(&0), "memory_reserve: None is one 0 byte");
    assert_eq!(JobSpec::from_stored(&v11[..v11.len() - 1]).unwrap(), now);
    let reserved = JobSpec {
        memory_reserve: Some(MemoryRequest::from(3u64 << 20)),
        ..now
    };
    assert_eq!(
        JobSpec::from_stored(&reserved.to_stored().unwrap()).unwrap(),
        reserved
    );
    assert!(
        JobSpec::from_stored(b"\x01").is_err() && JobSpec::from_stored(b"pws1\x01").is_err(),
        "junk is still refused"
    );
}

/// Host directories never go on the wire: a spec that names one arrives
/// without it, so no client can make a worker open a path of its host.
#[test]
fn a_host_directory_never_crosses_the_wire() {
    let spec = JobSpec {
        dirs: vec![DirGrant {
            host: "/etc".into(),
            guest: "/etc".into(),
            read_only: true,
        }],
        ..JobSpec::new(ModuleHash([2; 32]))
    };
    let arrived = postcard::from_bytes::<JobSpec>(&postcard::to_allocvec(&spec).unwrap()).unwrap();
    assert!(arrived.dirs.is_empty());
    assert_eq!(
        JobSpec {
            dirs: Vec::new(),
            ..spec
        },
        arrived
    );
}

#[test]
fn results_round_trip_through_postcard() {
    for outcome in [
        Outcome::Exited { code: 3 },
        Outcome::MemoryLimitExceeded {
            limit: 1,
            peak: 2,
            requested: 3,
        },
        Outcome::TimeLimitExceeded {
            limit_ms: 5,
            worker_limit: true,
        },
        Outcome::Cancelled {
            cause: CancelCause::Owner,
        },
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stderr,
            limit: 9,
        },
        Outcome::Trapped {
            trap: "unreachable".into(),
            message: "m".into(),
            backtrace: vec!["f".into()],
        },
        Outcome::InvalidModule { reason: "r".into() },
        Outcome::Rejected { reason: "r".into() },
        Outcome::FilesBackTooLarge { size: 2, limit: 1 },
    ] {
        let result = JobResult {
            outcome,
            stdout: b"out\xff".to_vec(),
            stderr: Vec::new(),
            peak_memory_bytes: 65536,
            memory_limit_bytes: 1 << 30,
            wall_time_us: 10,
            cpu_time_us: 9,
            cache: CacheSource::Disk,
            peer: "p".into(),
            warnings: vec!["w".into()],
            files: vec![tree::FileBack {
                tree: 0,
                path: "a/b".into(),
                size: 2,
                contents: vec![0, 255],
            }],
        };
        let bytes = postcard::to_allocvec(&result).unwrap();
        assert_eq!(postcard::from_bytes::<JobResult>(&bytes).unwrap(), result);
    }
    let spec = JobSpec::new(ModuleHash::of(b"m"));
    let bytes = postcard::to_allocvec(&spec).unwrap();
    assert_eq!(postcard::from_bytes::<JobSpec>(&bytes).unwrap(), spec);
}

#[test]
fn forged_adverts_fail_the_check() {
    let good = Advert {
        capacity_bytes: 1 << 30,
        slots_total: 2,
        slots_busy: 1,
        tenants: vec![TenantUsage {
            tenant: "a".into(),
            slot_seconds: 3.0,
            ..TenantUsage::default()
        }],
        ..Advert::default()
    };
    assert_eq!(good.check(), Ok(()));
    let usage = |v: f64| Advert {
        tenants: vec![TenantUsage {
            tenant: "b".into(),
            gib_seconds: v,
            ..TenantUsage::default()
        }],
        ..good.clone()
    };
    for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
        assert!(usage(bad).check().is_err(), "usage {bad} passed");
    }
    assert!(
        Advert {
            slots_busy: 3,
            ..good.clone()
        }
        .check()
        .is_err()
    );
    assert!(
        Advert {
            reserved_bytes: 2 << 30,
            ..good.clone()
        }
        .check()
        .is_err()
    );
    assert!(
        Advert {
            addr: "x".repeat(1000),
            ..good.clone()
        }
        .check()
        .is_err()
    );
    assert!(
        Advert {
            warnings: vec![String::new(); 1000],
            ..good
        }
        .check()
        .is_err()
    );
}

#[test]
fn truncated_or_garbage_bytes_are_errors_not_panics() {
    let spec = JobSpec::new(ModuleHash::of(b"m"));
    let bytes = postcard::to_allocvec(&spec).unwrap();
    for cut in 0..bytes.len() {
        assert!(postcard::from_bytes::<JobSpec>(&bytes[..cut]).is_err());
    }
    assert!(postcard::from_bytes::<JobSpec>(&[0xff; 64]).is_err());
}
