use super::*;

const GBPS: f64 = 1e9;

/// The HPCC simulator's preset at 100 Gb/s, one CNP at t = 0 and none after.
///
/// Derivation: the first CNP sets alpha = 1 and arms the rate-decrease check on its
/// 4 us grid (1 ns after the alpha grid). By then four 1 us alpha periods have
/// passed without a further CNP, so alpha = (1 - 1/256)^4 = 0.98447 and the cut gives
/// RC = 100 (1 - alpha / 2) = 50.777 Gb/s; RT stays at 100 (no clamp before the first
/// timer expiry). Each 300 us timer expiry then moves RC halfway to RT: the first is
/// fast recovery (T = 0 < F = 1), the next additive (T = F) and then hyper increase,
/// but RT is capped at the line rate, so every step is RC = (RC + 100) / 2:
/// 75.39, 87.69, 93.85, 96.92, 98.46 Gb/s.
#[test]
fn hpcc_preset_rate_after_one_cnp_matches_the_derivation() {
    let mut rp = ReactionPoint::new(DcqcnParams::hpcc(100.0 * GBPS));
    rp.handle_cnp(0);
    let cut_at = rp.next_timeout_ns().unwrap();
    assert_eq!(cut_at, 4_001);
    rp.handle_timeout(cut_at);
    let expect = [50.78, 75.39, 87.69, 93.85, 96.92, 98.46];
    let mut seen = vec![rp.rate_bps() / GBPS];
    for step in 1..expect.len() as u64 {
        rp.handle_timeout(cut_at + step * 300_000);
        seen.push(rp.rate_bps() / GBPS);
    }
    for (got, want) in seen.iter().zip(expect) {
        assert!((got - want).abs() < 0.1, "rates {seen:?}, want {expect:?}");
    }
    // Nothing happens between timer expiries.
    let before = rp.rate_bps();
    rp.handle_timeout(cut_at + 5 * 300_000 + 299_999);
    assert_eq!(rp.rate_bps(), before);
    assert_eq!(rp.counters(), (1, 1));
}

/// The reference simulator's `CheckRateDecreaseMlx` with `CLAMP_TARGET_RATE 0`: a cut
/// sets RT = RC only if the increase timer has fired since the previous cut
/// (`m_rpTimeStage != 0`); before that RT keeps its old value, so fast recovery heads
/// back to it.
#[test]
fn hpcc_preset_clamps_the_target_only_after_a_timer_expiry() {
    let line = 100.0 * GBPS;
    let mut rp = ReactionPoint::new(DcqcnParams::hpcc(line));
    rp.handle_cnp(0);
    rp.handle_timeout(4_001);
    rp.handle_cnp(10_000);
    let second = rp.next_timeout_ns().unwrap();
    assert_eq!(second, 12_001, "the next point of the 4 us grid");
    rp.handle_timeout(second);
    assert_eq!(rp.target_bps(), line, "no clamp before the timer fired");
    assert!(rp.rate_bps() < 50.0 * GBPS);
    let cut = rp.rate_bps();
    rp.handle_timeout(second + 300_000);
    assert!(
        (rp.rate_bps() - (cut + line) / 2.0).abs() < 1.0,
        "fast recovery"
    );
    let before = rp.rate_bps();
    rp.handle_cnp(second + 310_000);
    let third = rp.next_timeout_ns().unwrap();
    assert_eq!(third, 324_001);
    rp.handle_timeout(third);
    assert_eq!(rp.target_bps(), before, "clamped once the timer has fired");
    assert!(rp.rate_bps() < before);
    assert_eq!(rp.counters(), (3, 3));
}

#[test]
fn lazy_alpha_equals_tick_by_tick_alpha() {
    let p = DcqcnParams::hpcc(100.0 * GBPS);
    let mut lazy = ReactionPoint::new(p.clone());
    let mut eager = ReactionPoint::new(p);
    lazy.handle_cnp(0);
    eager.handle_cnp(0);
    lazy.handle_cnp(2_500);
    eager.handle_cnp(2_500);
    for t in (1_000..=50_000).step_by(1_000) {
        eager.alpha(t);
    }
    let (a, b) = (lazy.alpha(50_000), eager.alpha(50_000));
    assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    // One CNP in the period 2..3 us raised alpha once; every other period decayed it.
    let g = 1.0 / 256.0;
    let mut want = 1.0;
    for tick in 1..=50 {
        want = if tick == 3 {
            (1.0 - g) * want + g
        } else {
            (1.0 - g) * want
        };
    }
    assert!((a - want).abs() < 1e-12, "{a} vs {want}");
}

#[test]
fn repeated_cnps_drive_the_rate_to_its_floor_and_no_lower() {
    let mut rp = ReactionPoint::new(DcqcnParams::hpcc(100.0 * GBPS));
    for t in (0..2_000_000).step_by(4_000) {
        rp.handle_timeout(t);
        rp.handle_cnp(t);
    }
    rp.handle_timeout(2_000_000);
    assert_eq!(rp.rate_bps(), 1.0 * GBPS);
}

#[test]
fn connectx_cuts_at_most_by_half_and_counts_bytes() {
    // With rpg_gd = 10 the factor would be alpha (~0.98); rpg_min_dec_fac = 50%
    // bounds the cut to half.
    let steep = DcqcnParams {
        alpha_to_rate_shift: 10,
        ..DcqcnParams::connectx(100.0 * GBPS)
    };
    let mut rp = ReactionPoint::new(steep);
    rp.handle_cnp(0);
    rp.handle_timeout(rp.next_timeout_ns().unwrap());
    assert!(
        (rp.rate_bps() / GBPS - 50.0).abs() < 1e-9,
        "min_dec_fac bounds the cut"
    );
    let mut rp = ReactionPoint::new(DcqcnParams::connectx(100.0 * GBPS));
    rp.handle_cnp(0);
    rp.handle_timeout(rp.next_timeout_ns().unwrap());
    let cut = rp.rate_bps() / GBPS;
    assert!(cut > 50.0 && cut < 52.0, "alpha / 2 cut: {cut}");
    let before = rp.rate_bps();
    rp.handle_sent(32_767);
    assert!(rp.rate_bps() > before, "the byte counter raises the rate");
    let one_step = rp.rate_bps();
    rp.handle_sent(32_766);
    assert_eq!(
        rp.rate_bps(),
        one_step,
        "no increase short of the threshold"
    );
}

#[test]
fn paper_preset_cuts_at_each_cnp_and_clamps_the_target() {
    let mut rp = ReactionPoint::new(DcqcnParams::paper(40.0 * GBPS));
    rp.handle_cnp(0);
    assert!((rp.rate_bps() / GBPS - 20.0).abs() < 1e-9);
    rp.handle_cnp(50_000);
    assert_eq!(
        rp.target_bps(),
        20.0 * GBPS,
        "the target follows the rate down"
    );
    assert!(rp.rate_bps() < 20.0 * GBPS);
    assert_eq!(rp.counters(), (2, 2));
}

#[test]
fn an_idle_qp_at_line_rate_has_no_timers() {
    let mut rp = ReactionPoint::new(DcqcnParams::hpcc(100.0 * GBPS));
    assert_eq!(rp.next_timeout_ns(), None);
    rp.handle_cnp(0);
    let mut t = 0;
    while let Some(next) = rp.next_timeout_ns() {
        t = next;
        rp.handle_timeout(t);
        assert!(t < 100_000_000, "the timer never stops");
    }
    assert_eq!(rp.rate_bps(), 100.0 * GBPS);
    assert!(t > 4_000);
}

#[test]
fn notification_point_paces_per_qp_or_per_packet() {
    let mut paper = NotificationPoint::new(CnpMode::PerQpInterval {
        interval_ns: 50_000,
    });
    let sent: Vec<bool> = [0, 10_000, 49_999, 50_000, 60_000]
        .iter()
        .map(|&t| paper.handle_marked(t))
        .collect();
    assert_eq!(sent, [true, false, false, true, false]);
    let mut mlx = NotificationPoint::new(CnpMode::PerPacket { min_gap_ns: 0 });
    assert!((0..5).all(|t| mlx.handle_marked(t)));
    assert_eq!(mlx.counters(), (5, 5));
}

#[test]
fn presets_validate_and_bad_values_are_named() {
    for name in ["hpcc", "paper", "connectx"] {
        let p = DcqcnParams::preset(name, 100.0 * GBPS).unwrap();
        assert_eq!(p.validate(), Ok(()), "{name}");
    }
    assert!(DcqcnParams::preset("nope", 1.0).is_none());
    let mut p = DcqcnParams::hpcc(100.0 * GBPS);
    p.g = 2.0;
    assert!(p.validate().unwrap_err().contains("`g`"));
}
