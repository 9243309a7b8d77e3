//! What a run looked like from outside the gateways: their resident memory
//! and cache gauges over time, and the latency producers saw. Figures for
//! soak and churn runs, printed beside the verdicts; nothing here judges.

use std::fmt;

use super::scrape::sum_series;

/// One scrape of one gateway.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Seconds since the producers started.
    pub at_s: f64,
    /// The process's resident memory, as the kernel counts it.
    pub resident: u64,
    /// What the cache accounts for, over every shard.
    pub cache_bytes: u64,
    pub entries: u64,
    pub suppressed: u64,
    pub evictions: u64,
}

impl Sample {
    /// The sample in a `/metrics` text scraped `at_s` into the run.
    pub fn from_metrics(text: &str, at_s: f64) -> Sample {
        Sample {
            at_s,
            resident: sum_series(text, "stile_process_resident_memory_bytes"),
            cache_bytes: sum_series(text, "stile_cache_bytes"),
            entries: sum_series(text, "stile_cache_entries"),
            suppressed: sum_series(text, "stile_cache_suppressed_partitions"),
            evictions: sum_series(text, "stile_cache_evictions"),
        }
    }
}

/// A gateway process's samples, summarised: the peak, the median resident
/// memory in each quarter of its life (flat memory shows as four close
/// figures), and a few rows of the timeline.
pub fn describe(label: &str, samples: &[Sample]) -> Vec<String> {
    let Some(last) = samples.last() else {
        return vec![format!("{label}: no samples")];
    };
    let peak = samples.iter().map(|s| s.resident).max().unwrap_or(0);
    let peak_cache = samples.iter().map(|s| s.cache_bytes).max().unwrap_or(0);
    let quarters: Vec<String> = quarters(samples).iter().map(|&bytes| mib(bytes)).collect();
    let mut lines = vec![format!(
        "{label}: {} samples over {:.0} s; resident peak {} MiB, median by quarter [{}] MiB; cache accounted peak {} MiB; suppressed peak {}; evictions {}",
        samples.len(),
        last.at_s - samples[0].at_s,
        mib(peak),
        quarters.join(", "),
        mib(peak_cache),
        samples.iter().map(|s| s.suppressed).max().unwrap_or(0),
        last.evictions,
    )];
    let step = samples.len().div_ceil(10).max(1);
    for sample in samples.iter().step_by(step).chain(std::iter::once(last)) {
        lines.push(format!(
            "  t={:>6.1} s  resident {:>7} MiB  cache {:>7} MiB  entries {:>7}  suppressed {:>6}  evictions {:>8}",
            sample.at_s,
            mib(sample.resident),
            mib(sample.cache_bytes),
            sample.entries,
            sample.suppressed,
            sample.evictions
        ));
    }
    lines
}

/// The median resident memory of each quarter of the samples (by time).
pub fn quarters(samples: &[Sample]) -> Vec<u64> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Vec::new();
    };
    let span = (last.at_s - first.at_s).max(f64::EPSILON);
    (0..4)
        .filter_map(|q| {
            let mut quarter: Vec<u64> = samples
                .iter()
                .filter(|s| (((s.at_s - first.at_s) / span * 4.0) as usize).min(3) == q)
                .map(|s| s.resident)
                .collect();
            quarter.sort_unstable();
            quarter.get(quarter.len() / 2).copied()
        })
        .collect()
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

/// Latency percentiles of a set of durations in microseconds.
#[derive(Clone, Debug, Default)]
pub struct Latency {
    pub count: usize,
    pub p50_us: i64,
    pub p90_us: i64,
    pub p99_us: i64,
    pub p999_us: i64,
    pub max_us: i64,
}

impl Latency {
    pub fn of(mut durations_us: Vec<i64>) -> Latency {
        durations_us.sort_unstable();
        let at = |q: f64| -> i64 {
            if durations_us.is_empty() {
                return 0;
            }
            let rank = ((durations_us.len() as f64 * q).ceil() as usize).clamp(1, durations_us.len());
            durations_us[rank - 1]
        };
        Latency {
            count: durations_us.len(),
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: durations_us.last().copied().unwrap_or(0),
        }
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |us: i64| us as f64 / 1000.0;
        write!(
            f,
            "{} requests: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
            self.count,
            ms(self.p50_us),
            ms(self.p90_us),
            ms(self.p99_us),
            ms(self.p999_us),
            ms(self.max_us)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let latency = Latency::of((1..=1000).rev().collect());
        assert_eq!((latency.count, latency.p50_us, latency.p90_us, latency.p99_us, latency.p999_us), (1000, 500, 900, 990, 999));
        assert_eq!(latency.max_us, 1000);
        assert_eq!(Latency::of(Vec::new()).max_us, 0);
    }

    #[test]
    fn quarters_split_by_time() {
        let samples: Vec<Sample> =
            (0..8).map(|i| Sample { at_s: f64::from(i), resident: u64::from(i as u8) * 10, ..Sample::default() }).collect();
        assert_eq!(quarters(&samples), vec![10, 30, 50, 70]);
    }
}
