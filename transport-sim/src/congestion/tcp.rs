//! TCP congestion control as pure logic: the baseline every RoCE result is compared
//! against. Window in bytes; events in (ACKs with their ECN echo, losses,
//! timeouts), time passed in.
//!
//! - Slow start (cwnd += acked bytes) below `ssthresh`, congestion avoidance above.
//! - Reno: avoidance adds one MSS per window; a loss (three duplicate ACKs) halves
//!   the window (`ssthresh = cwnd / 2`); an ECN echo counts as a loss, at most once
//!   per window of data (RFC 3168).
//! - DCTCP (RFC 8257): the fraction F of ECN-echoing bytes per window updates
//!   `alpha = (1 - g) alpha + g F`; a window with any echo cuts `cwnd (1 - alpha/2)`;
//!   losses as Reno.
//! - Cubic (RFC 8312): avoidance follows `W(t) = C (t - K)^3 + W_max` with C = 0.4,
//!   beta = 0.7, never below the Reno-friendly estimate; a loss cuts to beta x cwnd.
//! - A retransmission timeout (with a minimum, Linux's 200 ms by default) drops the
//!   window to one MSS.

/// Which algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Loss-based AIMD.
    Reno,
    /// ECN-fraction proportional decrease.
    Dctcp,
    /// Cubic window growth.
    Cubic,
}

/// TCP congestion-control parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpParams {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Maximum segment size, bytes.
    pub mss: u64,
    /// Initial window in segments (Linux: 10).
    pub initial_window_segments: u64,
    /// DCTCP gain g (RFC 8257 suggests 1/16).
    pub dctcp_g: f64,
    /// Minimum retransmission timeout, ns (Linux: 200 ms).
    pub min_rto_ns: u64,
}

impl TcpParams {
    /// Linux-like defaults for `algorithm` with segments of `mss` bytes.
    pub fn linux(algorithm: Algorithm, mss: u64) -> Self {
        TcpParams {
            algorithm,
            mss,
            initial_window_segments: 10,
            dctcp_g: 1.0 / 16.0,
            min_rto_ns: 200_000_000,
        }
    }
}

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

/// The congestion state of one connection.
#[derive(Clone, Debug)]
pub struct TcpCc {
    p: TcpParams,
    cwnd: f64,
    ssthresh: f64,
    /// DCTCP: bytes acked and bytes echoing ECN in the current observation window.
    window_acked: u64,
    window_marked: u64,
    /// Bytes still to be acked before the current observation window ends.
    window_left: u64,
    alpha: f64,
    /// An ECN-triggered cut was already taken in this window.
    cut_this_window: bool,
    /// Cubic: window before the last cut and when it happened.
    w_max: f64,
    epoch_ns: Option<u64>,
    srtt_ns: Option<f64>,
    rttvar_ns: f64,
    backoff: u32,
}

impl TcpCc {
    /// A new connection.
    pub fn new(p: TcpParams) -> Self {
        let cwnd = (p.initial_window_segments * p.mss) as f64;
        TcpCc {
            p,
            cwnd,
            ssthresh: f64::INFINITY,
            window_acked: 0,
            window_marked: 0,
            window_left: cwnd as u64,
            alpha: 1.0,
            cut_this_window: false,
            w_max: 0.0,
            epoch_ns: None,
            srtt_ns: None,
            rttvar_ns: 0.0,
            backoff: 0,
        }
    }

    /// Congestion window, bytes.
    pub fn cwnd_bytes(&self) -> u64 {
        self.cwnd as u64
    }

    /// DCTCP's alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Retransmission timeout now, ns: SRTT + 4 RTTVAR, at least the minimum,
    /// doubled per consecutive timeout.
    pub fn rto_ns(&self) -> u64 {
        let base = match self.srtt_ns {
            Some(srtt) => (srtt + 4.0 * self.rttvar_ns) as u64,
            None => 1_000_000_000,
        };
        base.max(self.p.min_rto_ns) << self.backoff.min(6)
    }

    /// Smoothed round-trip time, if measured.
    pub fn srtt_ns(&self) -> Option<u64> {
        self.srtt_ns.map(|s| s as u64)
    }

    /// `acked` new bytes were acknowledged; `marked` of them echoed ECN CE.
    /// `rtt_ns` is a sample from a segment not retransmitted (Karn).
    pub fn on_ack(&mut self, now_ns: u64, acked: u64, marked: u64, rtt_ns: Option<u64>) {
        self.backoff = 0;
        if let Some(rtt) = rtt_ns {
            self.rtt_sample(rtt as f64);
        }
        let ecn = marked > 0;
        self.window_acked += acked;
        self.window_marked += marked;
        if ecn && !self.cut_this_window {
            match self.p.algorithm {
                Algorithm::Dctcp => {} // Cut at the window's end, by alpha.
                Algorithm::Reno | Algorithm::Cubic => {
                    self.multiplicative_decrease(now_ns);
                    self.cut_this_window = true;
                }
            }
        }
        if self.window_left > acked {
            self.window_left -= acked;
        } else {
            self.end_window();
        }
        if !ecn {
            self.grow(now_ns, acked);
        }
    }

    /// One observation window (about one RTT of data) is complete.
    fn end_window(&mut self) {
        if self.p.algorithm == Algorithm::Dctcp && self.window_acked > 0 {
            let f = self.window_marked as f64 / self.window_acked as f64;
            self.alpha = (1.0 - self.p.dctcp_g) * self.alpha + self.p.dctcp_g * f;
            if self.window_marked > 0 {
                self.cwnd = (self.cwnd * (1.0 - self.alpha / 2.0)).max(self.p.mss as f64);
                self.ssthresh = self.cwnd;
            }
        }
        self.window_acked = 0;
        self.window_marked = 0;
        self.window_left = self.cwnd as u64;
        self.cut_this_window = false;
    }

    fn grow(&mut self, now_ns: u64, acked: u64) {
        let mss = self.p.mss as f64;
        if self.cwnd < self.ssthresh {
            self.cwnd += acked as f64;
            return;
        }
        let reno = self.cwnd + mss * acked as f64 / self.cwnd;
        self.cwnd = match self.p.algorithm {
            Algorithm::Reno | Algorithm::Dctcp => reno,
            Algorithm::Cubic => {
                let epoch = *self.epoch_ns.get_or_insert(now_ns);
                let t = (now_ns - epoch) as f64 / 1e9;
                let w_max = self.w_max / mss;
                let k = (w_max * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
                let cubic = (CUBIC_C * (t - k).powi(3) + w_max) * mss;
                // Never grow more than 1.5x per window, never slower than Reno.
                cubic.min(self.cwnd * 1.5).max(reno)
            }
        };
    }

    fn multiplicative_decrease(&mut self, now_ns: u64) {
        let mss = self.p.mss as f64;
        let beta = match self.p.algorithm {
            Algorithm::Cubic => CUBIC_BETA,
            Algorithm::Reno | Algorithm::Dctcp => 0.5,
        };
        self.w_max = self.cwnd;
        self.epoch_ns = Some(now_ns);
        self.cwnd = (self.cwnd * beta).max(2.0 * mss);
        self.ssthresh = self.cwnd;
    }

    /// Three duplicate ACKs: a segment was lost.
    pub fn on_loss(&mut self, now_ns: u64) {
        self.multiplicative_decrease(now_ns);
        self.cut_this_window = true;
    }

    /// The retransmission timer fired with `inflight` bytes outstanding.
    pub fn on_timeout(&mut self, now_ns: u64, inflight: u64) {
        let mss = self.p.mss as f64;
        self.ssthresh = (inflight as f64 / 2.0).max(2.0 * mss);
        self.w_max = self.cwnd;
        self.epoch_ns = Some(now_ns);
        self.cwnd = mss;
        self.backoff += 1;
        self.window_left = self.p.mss;
    }

    fn rtt_sample(&mut self, rtt: f64) {
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(rtt);
                self.rttvar_ns = rtt / 2.0;
            }
            Some(srtt) => {
                self.rttvar_ns = 0.75 * self.rttvar_ns + 0.25 * (srtt - rtt).abs();
                self.srtt_ns = Some(0.875 * srtt + 0.125 * rtt);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u64 = 4096;

    #[test]
    fn slow_start_doubles_per_window_then_avoidance_adds_one_segment() {
        let mut cc = TcpCc::new(TcpParams::linux(Algorithm::Reno, MSS));
        assert_eq!(cc.cwnd_bytes(), 10 * MSS);
        cc.on_ack(0, 10 * MSS, 0, None);
        assert_eq!(cc.cwnd_bytes(), 20 * MSS);
        cc.on_loss(1);
        assert_eq!(cc.cwnd_bytes(), 10 * MSS);
        cc.on_ack(2, 10 * MSS, 0, None);
        let w = cc.cwnd_bytes();
        assert!(w > 10 * MSS && w <= 11 * MSS, "{w}");
    }

    #[test]
    fn dctcp_cuts_in_proportion_to_the_marked_fraction() {
        let mut cc = TcpCc::new(TcpParams::linux(Algorithm::Dctcp, MSS));
        // Converge alpha towards a steady 10% marking.
        for t in 0..200 {
            let w = cc.cwnd_bytes();
            cc.on_ack(t, w * 9 / 10, 0, None);
            cc.on_ack(t, w - w * 9 / 10, w / 10, None);
        }
        assert!((cc.alpha() - 0.1).abs() < 0.05, "alpha {}", cc.alpha());
        let before = cc.cwnd_bytes() as f64;
        let w = cc.cwnd_bytes();
        cc.on_ack(1_000, w, w / 10, None);
        let cut = 1.0 - cc.cwnd_bytes() as f64 / before;
        assert!(cut < 0.1, "DCTCP cut {cut:.3} like Reno");
    }

    #[test]
    fn reno_treats_an_echo_as_one_loss_per_window() {
        let mut cc = TcpCc::new(TcpParams::linux(Algorithm::Reno, MSS));
        cc.on_ack(0, MSS, MSS, None);
        let once = cc.cwnd_bytes();
        cc.on_ack(0, MSS, MSS, None);
        assert_eq!(cc.cwnd_bytes(), once, "cut twice in one window");
        assert_eq!(once, 5 * MSS);
    }

    #[test]
    fn cubic_regrows_towards_the_old_window_and_beyond() {
        let mut cc = TcpCc::new(TcpParams::linux(Algorithm::Cubic, MSS));
        for _ in 0..6 {
            let w = cc.cwnd_bytes();
            cc.on_ack(0, w, 0, None);
        }
        let peak = cc.cwnd_bytes();
        cc.on_loss(0);
        assert_eq!(cc.cwnd_bytes(), (peak as f64 * 0.7) as u64);
        let mut t = 0;
        while cc.cwnd_bytes() < peak && t < 10_000_000_000 {
            t += 1_000_000;
            let w = cc.cwnd_bytes();
            cc.on_ack(t, w, 0, None);
        }
        assert!(cc.cwnd_bytes() >= peak, "cubic never regained its window");
    }

    #[test]
    fn timeouts_back_off_from_the_minimum() {
        let mut cc = TcpCc::new(TcpParams::linux(Algorithm::Reno, MSS));
        cc.on_ack(0, MSS, 0, Some(20_000));
        assert_eq!(cc.rto_ns(), 200_000_000);
        cc.on_timeout(1, 10 * MSS);
        assert_eq!(cc.cwnd_bytes(), MSS);
        assert_eq!(cc.rto_ns(), 400_000_000);
        cc.on_ack(2, MSS, 0, Some(20_000));
        assert_eq!(cc.rto_ns(), 200_000_000);
    }
}
