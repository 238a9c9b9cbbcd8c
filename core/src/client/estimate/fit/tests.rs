use super::*;

const MIB: u64 = 1 << 20;

/// A deterministic stream of pseudo-random numbers in [0, 1).
fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` inputs of 0.2–4 MiB whose peak is 8 × size + 3 MiB, ±10%.
fn proportional(n: usize, seed: u64) -> Vec<Observation> {
    let mut r = uniform(seed);
    (0..n)
        .map(|_| {
            let size = ((0.2 + 3.8 * r()) * MIB as f64) as u64;
            let noise = 0.9 + 0.2 * r();
            Observation {
                size,
                peak: ((8.0 * size as f64 + 3.0 * MIB as f64) * noise) as u64,
            }
        })
        .collect()
}

/// Reserved ÷ needed, and the share that would run again, of `model`
/// on `obs`.
fn score(model: &Model, obs: &[Observation]) -> (f64, f64) {
    let asked: u64 = obs.iter().map(|o| model.request(o.size)).sum();
    let used: u64 = obs.iter().map(|o| o.peak).sum();
    let again = obs
        .iter()
        .filter(|o| o.peak > model.request(o.size))
        .count();
    (used as f64 / asked as f64, again as f64 / obs.len() as f64)
}

#[test]
fn a_peak_that_follows_the_input_is_fitted_and_covered() {
    let history = proportional(200, 1);
    let model = fit(&history, 1.25, 0).unwrap();
    let Model::BySize {
        slope,
        intercept,
        cover,
        ..
    } = model
    else {
        panic!("{model:?}")
    };
    assert!((7.5..8.5).contains(&slope), "slope {slope}");
    assert!(
        (2.0 * MIB as f64..4.0 * MIB as f64).contains(&intercept),
        "intercept {intercept}"
    );
    assert!((1.0..1.15).contains(&cover), "cover {cover}");
    // On inputs it has not seen: most reserved is used, few run again.
    let (used, again) = score(&model, &proportional(1000, 2));
    assert!(used >= 0.8, "used ÷ reserved {used}");
    assert!(again <= 0.05, "{again} ran again");
    assert!(
        model.describe().starts_with("peak ≈ 7.") || model.describe().starts_with("peak ≈ 8."),
        "{}",
        model.describe()
    );
    assert!(
        model.describe().contains("× input bytes + "),
        "{}",
        model.describe()
    );
}

#[test]
fn a_peak_unrelated_to_the_input_falls_back_to_one_request() {
    // Heavy tailed, unrelated to size: most 8 MiB, every 25th 160 MiB.
    let mut r = uniform(3);
    let history: Vec<Observation> = (0..250)
        .map(|i| Observation {
            size: (r() * 4.0 * MIB as f64) as u64,
            peak: if i % 25 == 12 {
                160 * MIB
            } else {
                ((6.0 + 4.0 * r()) * MIB as f64) as u64
            },
        })
        .collect();
    let model = fit(&history, 1.25, 0).unwrap();
    let Model::Blind { request, tail, .. } = model else {
        panic!("sizes do not predict these peaks: {model:?}")
    };
    assert!(
        request <= 11 * MIB,
        "the many small ones set the request: {request}"
    );
    // Twice out of memory: the tail.
    assert_eq!(
        model.retry(
            0,
            Outgrown {
                limit: 20 * MIB,
                requested: 21 * MIB,
                first: false
            },
            1.25,
            Some(tail)
        ),
        tail
    );
    assert_eq!(
        tail,
        round_to_pages(200 * MIB),
        "the largest × the margin, after a memory limit"
    );
    assert!(
        model
            .describe()
            .starts_with("peak does not follow input size"),
        "{}",
        model.describe()
    );
    // Every input too large for the request runs once more, at most.
    for o in &history {
        let outgrown = Outgrown {
            limit: request,
            requested: o.peak,
            first: true,
        };
        assert!(o.peak <= request || model.retry(o.size, outgrown, 1.25, None) >= o.peak);
    }
    // The first results of a run lack its large ones (they wait for
    // room, and come last): the largest known from before sets the tail.
    let early: Vec<Observation> = history
        .iter()
        .filter(|o| o.peak < 100 * MIB)
        .take(30)
        .map(|o| Observation {
            size: 100,
            peak: o.peak,
        })
        .collect();
    let Some(Model::Blind { tail, .. }) = fit(&early, 1.25, 160 * MIB) else {
        panic!()
    };
    assert_eq!(tail, round_to_pages(200 * MIB));
}

#[test]
fn peaks_all_alike_ask_for_the_largest_times_the_margin_as_before() {
    let history: Vec<Observation> = (0..20)
        .map(|i| Observation {
            size: i * 1000,
            peak: 10 * MIB + i * 4096,
        })
        .collect();
    let model = fit(&history, 1.25, 0).unwrap();
    for o in &history {
        assert!(
            model.request(o.size) >= o.peak,
            "{model:?} asks too little for {o:?}"
        );
    }
    let asked = model.request(0).max(model.request(19_000));
    assert!(
        asked <= round_to_pages((10 * MIB + 19 * 4096) * 5 / 4),
        "{model:?}"
    );
}

#[test]
fn adversarial_inputs_do_not_make_it_ask_for_nothing_or_everything() {
    // A huge input with a tiny peak among inputs whose peak follows size.
    let mut history = proportional(100, 4);
    history.push(Observation {
        size: 4 << 30,
        peak: MIB,
    });
    let model = fit(&history, 1.25, 0).unwrap();
    let (used, again) = score(&model, &proportional(500, 5));
    assert!(
        used >= 0.75 && again <= 0.05,
        "one outlier moved the fit: {model:?} ({used}, {again})"
    );
    // A tiny input with a huge peak: the fit stays; a retry of it asks
    // for at least twice its limit.
    let mut history = proportional(100, 6);
    history.push(Observation {
        size: 10,
        peak: 900 * MIB,
    });
    let model = fit(&history, 1.25, 0).unwrap();
    let (used, _) = score(&model, &proportional(500, 7));
    assert!(used >= 0.75, "{model:?}: {used}");
    assert!(
        model.retry(
            10,
            Outgrown {
                limit: 64 * MIB,
                requested: 65 * MIB,
                first: true
            },
            1.25,
            None
        ) >= 128 * MIB
    );
    // Sizes all equal: nothing to fit a slope to; one request.
    let same: Vec<Observation> = (0..20)
        .map(|i| Observation {
            size: 100,
            peak: (i + 1) * MIB,
        })
        .collect();
    assert!(matches!(fit(&same, 1.25, 0), Some(Model::Blind { .. })));
    // Too few results: no model yet.
    assert_eq!(fit(&same[..MIN_OBSERVATIONS - 1], 1.25, 0), None);
}

#[test]
fn a_retry_within_the_peaks_seen_asks_for_no_more_than_the_tail() {
    // Peaks of 10–40 MiB, inputs of 2–3 bytes ("9\n" … "38\n"): the
    // doubling of a 30 MiB limit would ask 60 MiB where 40 × 1.25 does.
    let history: Vec<Observation> = (0..60u64)
        .map(|i| 9 + (i * 17) % 30)
        .map(|m| Observation {
            size: if m < 10 { 2 } else { 3 },
            peak: (m + 1) * MIB,
        })
        .collect();
    let model = fit(&history, 1.25, 0).unwrap();
    let tail = round_to_pages(39 * MIB * 5 / 4);
    for o in &history {
        let limit = model.request(o.size);
        if o.peak > limit {
            let retry = model.retry(
                o.size,
                Outgrown {
                    limit,
                    requested: o.peak,
                    first: true,
                },
                1.25,
                Some(tail),
            );
            assert!(
                retry >= o.peak && retry <= tail,
                "{model:?}: {retry} for {o:?}"
            );
        }
    }
    let retry = |limit, requested| {
        retry_floor(
            Outgrown {
                limit,
                requested,
                first: true,
            },
            Some(tail),
        )
    };
    assert_eq!(
        retry(30 * MIB, 31 * MIB),
        tail,
        "the doubling stops at the tail"
    );
    assert_eq!(
        retry(10 * MIB, 11 * MIB),
        20 * MIB,
        "below it, twice the limit"
    );
    assert_eq!(
        retry(30 * MIB, 60 * MIB),
        grown(60 * MIB),
        "what it tried to grow to, beyond the tail"
    );
    assert_eq!(
        retry(tail, tail + 1),
        2 * tail,
        "over the tail already: twice again"
    );
    assert_eq!(
        retry_floor(
            Outgrown {
                limit: 30 * MIB,
                requested: 31 * MIB,
                first: true
            },
            None
        ),
        60 * MIB
    );
}

#[test]
fn below_the_sizes_seen_it_asks_as_for_the_smallest_seen() {
    // Only large inputs seen so far (a map launches its largest first).
    let large: Vec<Observation> = proportional(400, 10)
        .into_iter()
        .filter(|o| o.size > 3 * MIB)
        .collect();
    let model = fit(&large, 1.25, 0).unwrap();
    let Model::BySize { smallest, .. } = model else {
        panic!("{model:?}")
    };
    assert!(smallest > 3 * MIB);
    let tiny = model.request(64 << 10);
    assert_eq!(
        tiny,
        model.request(smallest),
        "not extrapolated below what was seen"
    );
    assert!(
        tiny >= 8 * (64 << 10) + 3 * MIB,
        "enough for a tiny input: {tiny}"
    );
}

#[test]
fn a_change_of_regime_is_followed_once_the_history_is_the_new_one() {
    // Memory follows size, then (a new version of the job) it does not.
    let mut r = uniform(8);
    let before = proportional(100, 9);
    let after: Vec<Observation> = (0..100)
        .map(|_| Observation {
            size: (r() * 4.0 * MIB as f64) as u64,
            peak: ((20.0 + 10.0 * r()) * MIB as f64) as u64,
        })
        .collect();
    assert!(matches!(fit(&before, 1.25, 0), Some(Model::BySize { .. })));
    let model = fit(&after, 1.25, 0).unwrap();
    for o in &after {
        let outgrown = Outgrown {
            limit: model.request(o.size),
            requested: o.peak,
            first: true,
        };
        assert!(
            model.request(o.size) >= o.peak || model.retry(o.size, outgrown, 1.25, None) >= o.peak,
            "{model:?}"
        );
    }
}

/// The reserve sits on the line's middle — half the inputs over it, each
/// then borrowing a little — and under the request, the limit; Σ
/// max(reserve, peak) is within a few percent of Σ peaks, where Σ
/// requests is the top of the noise. A blind model reserves its request.
#[test]
fn the_reserve_is_the_middle_of_the_noise_and_costs_a_few_percent_over_the_peaks() {
    let model = fit(&proportional(200, 1), 1.25, 0).unwrap();
    let seen = proportional(1000, 3);
    let (mut over, mut held, mut asked, mut used) = (0, 0u64, 0u64, 0u64);
    for o in &seen {
        let reserve = model.reserve(o.size).expect("a by-size model reserves");
        assert!(reserve <= model.request(o.size));
        over += usize::from(o.peak > reserve);
        held += reserve.max(o.peak);
        asked += model.request(o.size);
        used += o.peak;
    }
    let share_over = over as f64 / seen.len() as f64;
    assert!(
        (0.3..0.7).contains(&share_over),
        "{share_over} over their reserve"
    );
    let held = held as f64 / used as f64;
    assert!(held < 1.05, "max(reserve, peak) ÷ peak {held}");
    assert!(
        held < asked as f64 / used as f64 - 0.03,
        "the requests cost more"
    );
    assert!(
        model.describe().contains("reserve × 1.0") || model.describe().contains("reserve × 0.9"),
        "{}",
        model.describe()
    );
    // A model saved before reserves existed (no center) reserves the request.
    let mut old = model;
    if let Model::BySize { center, .. } = &mut old {
        *center = 0.0;
    }
    assert_eq!(old.reserve(MIB), None);
    let blind = Model::Blind {
        request: 10 * MIB,
        tail: 100 * MIB,
        reserve: 0,
    };
    assert_eq!(
        blind.reserve(MIB),
        None,
        "a blind model saved before reserves"
    );
}

#[test]
fn a_blind_model_reserves_the_peaks_middle_and_asks_for_more_as_its_limit() {
    // Peaks unrelated to size: 4..=20 MiB, spread evenly, each input 1 KiB.
    let history: Vec<Observation> = (0..100u64)
        .map(|i| Observation {
            size: 1024 + (i * 7919) % 512,
            peak: 4 * MIB + (i * 37 % 100) * 16 * MIB / 100,
        })
        .collect();
    let model = fit(&history, 1.25, 0).unwrap();
    let Model::Blind {
        request, reserve, ..
    } = model
    else {
        panic!("sizes do not predict these peaks: {model:?}")
    };
    let reserved = model.reserve(1024).expect("a blind model reserves");
    assert_eq!(reserved, reserve);
    assert!(
        (11 * MIB..=13 * MIB).contains(&reserved),
        "the middle of 4..20 MiB: {reserved}"
    );
    assert!(reserved < request, "{reserved} !< {request}");
    assert!(
        model.describe().contains(" (reserve 11.9 MiB)"),
        "{}",
        model.describe()
    );
    // Saved and read back, the reserve stays; a file from before it reads 0.
    let json = serde_json::to_string(&model).unwrap();
    assert_eq!(serde_json::from_str::<Model>(&json).unwrap(), model);
    let old: Model =
        serde_json::from_str(r#"{"Blind":{"request":1048576,"tail":4194304}}"#).unwrap();
    assert_eq!(old.reserve(1), None);
}
