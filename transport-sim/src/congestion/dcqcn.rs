//! DCQCN as pure logic: the reaction point (sender NIC, per QP) and the notification
//! point (receiver NIC), sans-IO, with time passed in.
//!
//! Reaction point, in the Mellanox/NVIDIA form the HPCC simulator also implements:
//!
//! - Alpha: from the first CNP on, alpha is updated every `alpha_update_interval`:
//!   `alpha = (1 - g) alpha + g` if a CNP arrived in that period, else
//!   `alpha = (1 - g) alpha`. The first CNP sets alpha to `initial_alpha` and does not
//!   count as "arrived" for the first period. Updates are applied lazily in closed
//!   form, so an idle QP costs no events.
//! - Rate decrease: checked every `rate_decrease_interval` (on a grid starting at the
//!   first CNP, 1 ns after the alpha grid so the alpha update comes first); if a CNP
//!   arrived since the last check, the target rate is clamped to the current rate
//!   (always with `clamp_target_rate`, else only when the increase timer has fired
//!   since the last cut) and `RC = max(min_rate, RC (1 - f))`, with
//!   `f = min(alpha * 2^10 / 2^alpha_to_rate_shift, 1 - min_decrease_ratio)`; the
//!   increase timer, byte counter and their stages restart. An interval of 0 cuts at
//!   the CNP itself (the paper's form).
//! - Rate increase: on every expiry of the increase timer (`timer`, rearmed each
//!   time) and every `byte_counter` bytes sent, with `T` and `BC` the numbers of such
//!   events since the last cut, evaluated before they are incremented: fast recovery
//!   `RC = (RC + RT) / 2` while `max(T, BC) < F`; hyper increase `RT += R_HAI` once
//!   `min(T, BC) > F`; otherwise additive increase `RT += R_AI`; after an increase
//!   `RC = (RC + RT) / 2`. RT never exceeds the line rate. With the byte counter off,
//!   `BC` follows `T` (the HPCC simulator's timer-only form).
//!
//! Notification point: a receiver turns ECN-marked arrivals into CNPs, either at most
//! one per QP per `cnp_interval` (the paper) or one per marked packet, optionally
//! with a minimum gap (NVIDIA's `min_time_between_cnps`).

/// Reaction-point parameters. Rates in bits per second, times in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct DcqcnParams {
    /// Line rate: the starting rate and the ceiling of the target rate.
    pub line_rate_bps: f64,
    /// Alpha gain g.
    pub g: f64,
    /// Alpha set on the first CNP.
    pub initial_alpha: f64,
    /// Period of the alpha update.
    pub alpha_update_interval_ns: u64,
    /// Period of the rate-decrease check; 0 cuts at each CNP.
    pub rate_decrease_interval_ns: u64,
    /// Rate decrease factor is `alpha * 2^10 / 2^shift`: 11 gives the paper's
    /// `alpha / 2` (NVIDIA `rpg_gd`).
    pub alpha_to_rate_shift: u32,
    /// A single cut leaves at least this fraction of the rate (NVIDIA
    /// `rpg_min_dec_fac` / 100); 0 for no bound.
    pub min_decrease_ratio: f64,
    /// Rate (current and target) set on the first CNP; `None` keeps the current rate.
    pub rate_on_first_cnp_bps: Option<f64>,
    /// Clamp the target rate to the current rate on every cut.
    pub clamp_target_rate: bool,
    /// Additive increase step R_AI.
    pub rate_ai_bps: f64,
    /// Hyper increase step R_HAI.
    pub rate_hai_bps: f64,
    /// Fast-recovery stages F.
    pub fast_recovery_stages: u32,
    /// Rate-increase timer period.
    pub timer_ns: u64,
    /// Rate-increase byte counter; `None` turns it off.
    pub byte_counter_bytes: Option<u64>,
    /// Floor of the rate.
    pub min_rate_bps: f64,
}

impl DcqcnParams {
    /// The HPCC simulator's "dcqcn" configuration (Li et al., SIGCOMM 2019, ns-3
    /// `rdma-hw`): g = 1/256, R_AI 20 Mb/s, R_HAI 200 Mb/s, F = 1, timer 300 us,
    /// alpha update every 1 us, rate decrease at most every 4 us, min rate 1 Gb/s,
    /// no target clamp, no byte counter.
    pub fn hpcc(line_rate_bps: f64) -> Self {
        DcqcnParams {
            line_rate_bps,
            g: 1.0 / 256.0,
            initial_alpha: 1.0,
            alpha_update_interval_ns: 1_000,
            rate_decrease_interval_ns: 4_000,
            alpha_to_rate_shift: 11,
            min_decrease_ratio: 0.0,
            rate_on_first_cnp_bps: None,
            clamp_target_rate: false,
            rate_ai_bps: 20e6,
            rate_hai_bps: 200e6,
            fast_recovery_stages: 1,
            timer_ns: 300_000,
            byte_counter_bytes: None,
            min_rate_bps: 1e9,
        }
    }

    /// The DCQCN paper's parameters (Zhu et al., SIGCOMM 2015): g = 1/256, cut at
    /// each CNP (the notification point paces CNPs at 50 us), alpha timer 55 us,
    /// increase timer 55 us, byte counter 10 MB, F = 5, R_AI 40 Mb/s, target clamped
    /// on every cut. The paper fixes no R_HAI; 200 Mb/s (5 x R_AI) is used here.
    pub fn paper(line_rate_bps: f64) -> Self {
        DcqcnParams {
            line_rate_bps,
            g: 1.0 / 256.0,
            initial_alpha: 1.0,
            alpha_update_interval_ns: 55_000,
            rate_decrease_interval_ns: 0,
            alpha_to_rate_shift: 11,
            min_decrease_ratio: 0.0,
            rate_on_first_cnp_bps: None,
            clamp_target_rate: true,
            rate_ai_bps: 40e6,
            rate_hai_bps: 200e6,
            fast_recovery_stages: 5,
            timer_ns: 55_000,
            byte_counter_bytes: Some(10_000_000),
            min_rate_bps: 10e6,
        }
    }

    /// NVIDIA ConnectX firmware defaults as the mlx5 driver exposes them
    /// (`roce_rp`): `dce_tcp_g` 1019 (g = 5/1024), `dce_tcp_rtt` 1 us,
    /// `initial_alpha_value` 1023/1024, `rate_reduce_monitor_period` 4 us, `rpg_gd`
    /// 11, `rpg_min_dec_fac` 50%, `rpg_min_rate` 1 Mb/s, `rate_to_set_on_first_cnp`
    /// 0 (keep), `rpg_time_reset` 300 us, `rpg_byte_reset` 32767 B, `rpg_threshold`
    /// 1, `rpg_ai_rate` 5 Mb/s, `rpg_hai_rate` 50 Mb/s.
    pub fn connectx(line_rate_bps: f64) -> Self {
        DcqcnParams {
            line_rate_bps,
            g: 5.0 / 1024.0,
            initial_alpha: 1023.0 / 1024.0,
            alpha_update_interval_ns: 1_000,
            rate_decrease_interval_ns: 4_000,
            alpha_to_rate_shift: 11,
            min_decrease_ratio: 0.5,
            rate_on_first_cnp_bps: None,
            clamp_target_rate: false,
            rate_ai_bps: 5e6,
            rate_hai_bps: 50e6,
            fast_recovery_stages: 1,
            timer_ns: 300_000,
            byte_counter_bytes: Some(32_767),
            min_rate_bps: 1e6,
        }
    }

    /// A preset by name: `hpcc`, `paper` or `connectx`.
    pub fn preset(name: &str, line_rate_bps: f64) -> Option<Self> {
        match name {
            "hpcc" => Some(Self::hpcc(line_rate_bps)),
            "paper" => Some(Self::paper(line_rate_bps)),
            "connectx" => Some(Self::connectx(line_rate_bps)),
            _ => None,
        }
    }

    /// Check the parameters; a bad one is named.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str| Err(format!("dcqcn parameter `{k}` out of range"));
        if self.line_rate_bps.is_nan() || self.line_rate_bps <= 0.0 {
            return bad("line_rate_bps");
        }
        if !(0.0..=1.0).contains(&self.g) {
            return bad("g");
        }
        if !(0.0..=1.0).contains(&self.initial_alpha) {
            return bad("initial_alpha");
        }
        if self.alpha_update_interval_ns == 0 {
            return bad("alpha_update_interval_ns");
        }
        if self.timer_ns == 0 {
            return bad("timer_ns");
        }
        if self.byte_counter_bytes == Some(0) {
            return bad("byte_counter_bytes");
        }
        if !(0.0..1.0).contains(&self.min_decrease_ratio) {
            return bad("min_decrease_ratio");
        }
        if self.min_rate_bps.is_nan()
            || self.min_rate_bps <= 0.0
            || self.min_rate_bps > self.line_rate_bps
        {
            return bad("min_rate_bps");
        }
        if !(10..=30).contains(&self.alpha_to_rate_shift) {
            return bad("alpha_to_rate_shift");
        }
        Ok(())
    }
}

/// The reaction point of one QP.
#[derive(Clone, Debug)]
pub struct ReactionPoint {
    p: DcqcnParams,
    rate_bps: f64,
    target_bps: f64,
    alpha: f64,
    /// Time of the first CNP: the origin of the alpha and decrease grids.
    first_cnp_ns: Option<u64>,
    /// Time of the last alpha update applied.
    alpha_updated_ns: u64,
    cnp_for_alpha: bool,
    /// A CNP arrived and the cut it asks for is pending at this time.
    decrease_at_ns: Option<u64>,
    /// Next expiry of the increase timer, while it runs.
    timer_at_ns: Option<u64>,
    timer_stage: u32,
    byte_stage: u32,
    bytes_since: u64,
    cnps: u64,
    cuts: u64,
}

impl ReactionPoint {
    /// A QP sending at line rate, never congested.
    pub fn new(p: DcqcnParams) -> Self {
        debug_assert!(p.validate().is_ok(), "{:?}", p.validate());
        ReactionPoint {
            rate_bps: p.line_rate_bps,
            target_bps: p.line_rate_bps,
            alpha: p.initial_alpha,
            p,
            first_cnp_ns: None,
            alpha_updated_ns: 0,
            cnp_for_alpha: false,
            decrease_at_ns: None,
            timer_at_ns: None,
            timer_stage: 0,
            byte_stage: 0,
            bytes_since: 0,
            cnps: 0,
            cuts: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &DcqcnParams {
        &self.p
    }

    /// Current rate RC, bits per second.
    pub fn rate_bps(&self) -> f64 {
        self.rate_bps
    }

    /// Target rate RT, bits per second.
    pub fn target_bps(&self) -> f64 {
        self.target_bps
    }

    /// Alpha as of `now_ns` (alpha updates are applied lazily).
    pub fn alpha(&mut self, now_ns: u64) -> f64 {
        self.catch_up_alpha(now_ns);
        self.alpha
    }

    /// CNPs received and rate cuts made.
    pub fn counters(&self) -> (u64, u64) {
        (self.cnps, self.cuts)
    }

    /// When [`ReactionPoint::handle_timeout`] must next be called, if ever.
    pub fn next_timeout_ns(&self) -> Option<u64> {
        match (self.decrease_at_ns, self.timer_at_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Apply the alpha updates due in `(alpha_updated_ns, now_ns]`.
    fn catch_up_alpha(&mut self, now_ns: u64) {
        let Some(_) = self.first_cnp_ns else { return };
        let interval = self.p.alpha_update_interval_ns;
        if now_ns < self.alpha_updated_ns + interval {
            return;
        }
        let ticks = (now_ns - self.alpha_updated_ns) / interval;
        let keep = 1.0 - self.p.g;
        // The first tick sees the CNP flag; the rest decay.
        self.alpha = if self.cnp_for_alpha {
            keep * self.alpha + self.p.g
        } else {
            keep * self.alpha
        };
        self.alpha *= keep.powi((ticks - 1).min(i32::MAX as u64) as i32);
        self.cnp_for_alpha = false;
        self.alpha_updated_ns += ticks * interval;
        debug_assert!((0.0..=1.0).contains(&self.alpha));
    }

    /// A CNP arrived.
    pub fn handle_cnp(&mut self, now_ns: u64) {
        self.cnps += 1;
        self.catch_up_alpha(now_ns);
        let Some(first) = self.first_cnp_ns else {
            self.first_cnp_ns = Some(now_ns);
            self.alpha = self.p.initial_alpha;
            self.alpha_updated_ns = now_ns;
            self.cnp_for_alpha = false;
            if let Some(rate) = self.p.rate_on_first_cnp_bps {
                self.rate_bps = rate.clamp(self.p.min_rate_bps, self.p.line_rate_bps);
                self.target_bps = self.rate_bps;
            }
            self.schedule_decrease(now_ns, now_ns);
            return;
        };
        self.cnp_for_alpha = true;
        if self.decrease_at_ns.is_none() {
            self.schedule_decrease(first, now_ns);
        }
    }

    /// Arm the cut a CNP at `now_ns` asks for: at the next point of the decrease grid
    /// that starts at `origin` (1 ns after the alpha grid), or at once.
    fn schedule_decrease(&mut self, origin: u64, now_ns: u64) {
        let interval = self.p.rate_decrease_interval_ns;
        if interval == 0 {
            self.decrease(now_ns);
            return;
        }
        let base = origin + 1;
        let k = if now_ns < base + interval {
            1
        } else {
            (now_ns - base) / interval + 1
        };
        self.decrease_at_ns = Some(base + k * interval);
    }

    fn decrease(&mut self, now_ns: u64) {
        self.catch_up_alpha(now_ns);
        if self.p.clamp_target_rate || self.timer_stage != 0 {
            self.target_bps = self.rate_bps;
        }
        let scale = f64::from(1u32 << 10) / 2f64.powi(self.p.alpha_to_rate_shift as i32);
        let factor = (self.alpha * scale).min(1.0 - self.p.min_decrease_ratio);
        self.rate_bps = (self.rate_bps * (1.0 - factor)).max(self.p.min_rate_bps);
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.bytes_since = 0;
        self.timer_at_ns = Some(now_ns + self.p.timer_ns);
        self.cuts += 1;
    }

    /// Process every timer due at or before `now_ns`, in time order.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        loop {
            let due_decrease = self.decrease_at_ns.filter(|&t| t <= now_ns);
            let due_timer = self.timer_at_ns.filter(|&t| t <= now_ns);
            match (due_decrease, due_timer) {
                (Some(d), t) if t.is_none_or(|t| d <= t) => {
                    self.decrease_at_ns = None;
                    self.decrease(d);
                }
                (_, Some(t)) => {
                    self.timer_at_ns = Some(t + self.p.timer_ns);
                    self.increase(IncreaseBy::Timer);
                    self.stop_timer_when_idle();
                }
                _ => return,
            }
        }
    }

    /// `bytes` were sent: advance the byte counter.
    pub fn handle_sent(&mut self, bytes: u64) {
        let Some(threshold) = self.p.byte_counter_bytes else {
            return;
        };
        if self.first_cnp_ns.is_none() || self.timer_at_ns.is_none() {
            return; // At line rate there is nothing to recover.
        }
        self.bytes_since += bytes;
        while self.bytes_since >= threshold {
            self.bytes_since -= threshold;
            self.increase(IncreaseBy::Bytes);
        }
        self.stop_timer_when_idle();
    }

    fn increase(&mut self, by: IncreaseBy) {
        let f = self.p.fast_recovery_stages;
        let t = self.timer_stage;
        let bc = if self.p.byte_counter_bytes.is_some() {
            self.byte_stage
        } else {
            t
        };
        if t.max(bc) < f {
            // Fast recovery: halfway back to the target.
        } else if t.min(bc) > f {
            self.target_bps += self.p.rate_hai_bps;
        } else {
            self.target_bps += self.p.rate_ai_bps;
        }
        self.target_bps = self.target_bps.min(self.p.line_rate_bps);
        self.rate_bps = (self.rate_bps + self.target_bps) / 2.0;
        match by {
            IncreaseBy::Timer => self.timer_stage += 1,
            IncreaseBy::Bytes => self.byte_stage += 1,
        }
        debug_assert!(self.rate_bps <= self.p.line_rate_bps * (1.0 + 1e-12));
    }

    /// Back at line rate with nothing pending: stop the timer so an idle QP costs
    /// no events. The next CNP starts everything again.
    fn stop_timer_when_idle(&mut self) {
        let line = self.p.line_rate_bps;
        if self.decrease_at_ns.is_none() && self.target_bps >= line && line - self.rate_bps < 1.0 {
            self.rate_bps = line;
            self.timer_at_ns = None;
        }
    }
}

#[derive(Clone, Copy)]
enum IncreaseBy {
    Timer,
    Bytes,
}

/// How a receiver turns ECN marks into CNPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CnpMode {
    /// At most one CNP per QP per interval (the DCQCN paper: 50 us).
    PerQpInterval {
        /// Minimum time between CNPs of one QP.
        interval_ns: u64,
    },
    /// A CNP for every marked packet, at most one per `min_gap_ns` per QP
    /// (NVIDIA `min_time_between_cnps`; 0 for none).
    PerPacket {
        /// Minimum time between CNPs of one QP.
        min_gap_ns: u64,
    },
}

/// The notification point of one QP at the receiver.
#[derive(Clone, Debug)]
pub struct NotificationPoint {
    mode: CnpMode,
    last_cnp_ns: Option<u64>,
    marked: u64,
    cnps: u64,
}

impl NotificationPoint {
    /// A notification point in `mode`.
    pub fn new(mode: CnpMode) -> Self {
        NotificationPoint {
            mode,
            last_cnp_ns: None,
            marked: 0,
            cnps: 0,
        }
    }

    /// An ECN-marked packet arrived: true if a CNP must be sent now.
    pub fn handle_marked(&mut self, now_ns: u64) -> bool {
        self.marked += 1;
        let gap = match self.mode {
            CnpMode::PerQpInterval { interval_ns } => interval_ns,
            CnpMode::PerPacket { min_gap_ns } => min_gap_ns,
        };
        let send = self.last_cnp_ns.is_none_or(|last| now_ns >= last + gap);
        if send {
            self.last_cnp_ns = Some(now_ns);
            self.cnps += 1;
        }
        send
    }

    /// Marked packets seen and CNPs sent.
    pub fn counters(&self) -> (u64, u64) {
        (self.marked, self.cnps)
    }
}

#[cfg(test)]
mod tests;
