//! Fabric telemetry of a run, written next to the report: CSV series and SVG plots.
//!
//! - `ports.csv`: `time_us,port,queue_bytes,paused` for every switch port, every
//!   sample.
//! - `qps.csv`: `time_us,src,dst,rate_gbps,alpha` for every QP DCQCN holds below
//!   line rate.
//! - `counters.csv`: `counter,value` for the fabric's counters.
//! - `queues.svg`: queue length over time of the busiest switch ports.
//! - `rates.svg`: rate over time of the most throttled QPs.

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Points of one series: (time us, value).
pub(crate) type Points = Vec<(f64, f64)>;

/// Series plotted at most per chart.
pub const SERIES_PLOTTED_MAX: usize = 8;

/// One sample, in the simulator's terms (see `weir_transport_sim::fabric`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Time, microseconds since the run started.
    pub time_us: f64,
    /// (port name, queue bytes, paused) of every switch port.
    pub ports: Vec<(String, u64, bool)>,
    /// (sender, receiver, rate Gb/s, alpha) of every throttled QP.
    pub qps: Vec<(String, String, f64, f64)>,
}

/// Everything a run's telemetry holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Telemetry {
    /// The time series.
    pub samples: Vec<Sample>,
    /// Fabric counters by name, in a fixed order.
    pub counters: Vec<(String, u64)>,
}

/// Why telemetry could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw {path}: {message}")]
    Plot {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

impl Telemetry {
    /// Write the CSV files and SVG plots into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> Result<Vec<String>, TelemetryError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| TelemetryError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut written = Vec::new();
        for (name, text) in [
            ("ports.csv", self.ports_csv()),
            ("qps.csv", self.qps_csv()),
            ("counters.csv", self.counters_csv()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io(&path))?;
            written.push(path.display().to_string());
        }
        let queues = dir.join("queues.svg");
        self.plot(
            &queues,
            "switch egress queues",
            "queue KB",
            self.queue_series(),
        )?;
        written.push(queues.display().to_string());
        let rates = dir.join("rates.svg");
        self.plot(
            &rates,
            "throttled QP rates (DCQCN)",
            "rate Gb/s",
            self.rate_series(),
        )?;
        written.push(rates.display().to_string());
        Ok(written)
    }

    fn ports_csv(&self) -> String {
        let mut out = String::from("time_us,port,queue_bytes,paused\n");
        for s in &self.samples {
            for (port, bytes, paused) in &s.ports {
                let _ = writeln!(out, "{:.3},{port},{bytes},{}", s.time_us, u8::from(*paused));
            }
        }
        out
    }

    fn qps_csv(&self) -> String {
        let mut out = String::from("time_us,src,dst,rate_gbps,alpha\n");
        for s in &self.samples {
            for (src, dst, rate, alpha) in &s.qps {
                let _ = writeln!(out, "{:.3},{src},{dst},{rate:.3},{alpha:.5}", s.time_us);
            }
        }
        out
    }

    fn counters_csv(&self) -> String {
        let mut out = String::from("counter,value\n");
        for (name, value) in &self.counters {
            let _ = writeln!(out, "{name},{value}");
        }
        out
    }

    /// Queue series of the ports with the largest peak queue.
    fn queue_series(&self) -> Vec<(String, Points)> {
        let mut series: BTreeMap<&str, Points> = BTreeMap::new();
        for s in &self.samples {
            for (port, bytes, _) in &s.ports {
                series
                    .entry(port)
                    .or_default()
                    .push((s.time_us, *bytes as f64 / 1000.0));
            }
        }
        top(series, |points| {
            points.iter().map(|p| p.1).fold(0.0, f64::max)
        })
    }

    /// Rate series of the QPs throttled the most (lowest minimum rate).
    fn rate_series(&self) -> Vec<(String, Points)> {
        let mut series: BTreeMap<String, Points> = BTreeMap::new();
        for s in &self.samples {
            for (src, dst, rate, _) in &s.qps {
                series
                    .entry(format!("{src}->{dst}"))
                    .or_default()
                    .push((s.time_us, *rate));
            }
        }
        let series: BTreeMap<&str, Points> = series
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        top(series, |points| {
            -points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min)
        })
    }

    fn plot(
        &self,
        path: &Path,
        title: &str,
        y_label: &str,
        series: Vec<(String, Points)>,
    ) -> Result<(), TelemetryError> {
        let t_max = self.samples.last().map_or(1.0, |s| s.time_us).max(1.0);
        line_chart(path, title, ("time us", t_max), y_label, series)
    }
}

/// An SVG line chart of `series` over x in `0..x_max`, one colour and legend
/// entry per series.
pub(crate) fn line_chart(
    path: &Path,
    title: &str,
    (x_label, x_max): (&str, f64),
    y_label: &str,
    series: Vec<(String, Points)>,
) -> Result<(), TelemetryError> {
    let err = |e: &dyn std::fmt::Display| TelemetryError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let y_max = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.05;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The `SERIES_PLOTTED_MAX` series with the highest `score`, ties by name.
fn top(
    series: BTreeMap<&str, Points>,
    score: impl Fn(&[(f64, f64)]) -> f64,
) -> Vec<(String, Points)> {
    let mut all: Vec<(f64, String, Points)> = series
        .into_iter()
        .map(|(name, pts)| (score(&pts), name.to_string(), pts))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    all.into_iter()
        .take(SERIES_PLOTTED_MAX)
        .map(|(_, name, pts)| (name, pts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn telemetry() -> Telemetry {
        let samples = (0..50)
            .map(|i| Sample {
                time_us: f64::from(i) * 10.0,
                ports: vec![
                    ("sw0->n1".into(), 1000 * u64::from(i as u32), i > 40),
                    ("sw0->n2".into(), 7, false),
                ],
                qps: vec![("n3".into(), "n1".into(), 50.0 + f64::from(i), 0.5)],
            })
            .collect();
        Telemetry {
            samples,
            counters: vec![("pauses_sent".into(), 3)],
        }
    }

    #[test]
    fn writes_csvs_and_plots() {
        let dir = std::env::temp_dir().join(format!("weir-telemetry-test-{}", std::process::id()));
        let files = telemetry().write(&dir).unwrap();
        assert_eq!(files.len(), 5);
        let ports = std::fs::read_to_string(dir.join("ports.csv")).unwrap();
        assert_eq!(ports.lines().count(), 1 + 100);
        assert!(ports.contains("410.000,sw0->n1,41000,1"));
        let svg = std::fs::read_to_string(dir.join("queues.svg")).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("sw0-&gt;n1"),
            "no series label in the plot"
        );
        let rates = std::fs::read_to_string(dir.join("rates.svg")).unwrap();
        assert!(rates.contains("n3-&gt;n1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_busiest_series_are_plotted_first() {
        let t = telemetry();
        let q = t.queue_series();
        assert_eq!(q[0].0, "sw0->n1");
        assert_eq!(q.len(), 2);
    }
}
