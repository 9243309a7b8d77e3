//! The clock fault: a gateway whose wall clock is off PostgreSQL's, set with
//! libfaketime (Debian's `faketime` package) preloaded into the gateway
//! process, for the checker and the gateway tests. Its monotonic clock is left alone, as a VM resumed without time
//! sync or a time-sync step would leave it. The offset lives in a file that
//! libfaketime re-reads every second, so that the clock can jump mid-run; a
//! gateway restarted after a kill comes back with the offset then in force.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// A gateway's wall clock against the machine's (and PostgreSQL's), in
/// seconds: `offsets_s[0]` from the start, and each further offset from an
/// equal share of the run on, so that the clock jumps at each boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockSkew {
    pub offsets_s: Vec<i64>,
}

impl ClockSkew {
    /// Off by `offset_s` for the whole run.
    pub fn steady(offset_s: i64) -> ClockSkew {
        ClockSkew { offsets_s: vec![offset_s] }
    }

    /// Off by each offset in turn, jumping between them.
    pub fn jumping(offsets_s: &[i64]) -> ClockSkew {
        assert!(!offsets_s.is_empty(), "a clock skew has at least one offset");
        ClockSkew { offsets_s: offsets_s.to_vec() }
    }

    /// Parses `+150`, `-7200:+7200` (seconds, `:` between the offsets a run
    /// jumps through).
    pub fn parse(text: &str) -> anyhow::Result<ClockSkew> {
        let offsets_s = text
            .split(':')
            .map(|offset| offset.trim().parse::<i64>().with_context(|| format!("clock offset {offset:?} (seconds)")))
            .collect::<anyhow::Result<Vec<i64>>>()?;
        Ok(ClockSkew::jumping(&offsets_s))
    }

    /// The jumps after the start: when, into a run of `run`, and to what.
    pub fn jumps(&self, run: Duration) -> impl Iterator<Item = (Duration, i64)> + '_ {
        let shares = self.offsets_s.len() as u32;
        self.offsets_s.iter().enumerate().skip(1).map(move |(i, &offset_s)| (run * i as u32 / shares, offset_s))
    }
}

/// The file one gateway's libfaketime reads its offset from; removed when
/// dropped.
#[derive(Debug)]
pub struct ClockFile {
    path: PathBuf,
    library: PathBuf,
}

impl ClockFile {
    pub fn new(label: &str, offset_s: i64) -> anyhow::Result<ClockFile> {
        let library = libfaketime()?;
        static FILES: AtomicU64 = AtomicU64::new(0);
        let unique = format!("stile-checker-{}-{}-{label}.faketime", std::process::id(), FILES.fetch_add(1, Ordering::Relaxed));
        let file = ClockFile { path: std::env::temp_dir().join(unique), library };
        file.set(offset_s)?;
        Ok(file)
    }

    /// Moves the clock to `offset_s` from the machine's; the gateway sees it
    /// within a second.
    pub fn set(&self, offset_s: i64) -> anyhow::Result<()> {
        // Written aside and renamed, so that no read sees half an offset.
        let staged = self.path.with_extension("next");
        std::fs::write(&staged, format!("{offset_s:+}s\n")).with_context(|| format!("write {}", staged.display()))?;
        std::fs::rename(&staged, &self.path).with_context(|| format!("rename to {}", self.path.display()))
    }

    /// Preloads libfaketime into `command`, reading this file.
    pub fn apply(&self, command: &mut Command) {
        command
            .env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", &self.path)
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env_remove("FAKETIME");
    }
}

impl Drop for ClockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// libfaketime's thread-safe build: `STILE_LIBFAKETIME`, or where Debian's
/// `faketime` package puts it.
fn libfaketime() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("STILE_LIBFAKETIME") {
        return Ok(PathBuf::from(path));
    }
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketimeMT.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketimeMT.so.1")])
        .find(|path| Path::new(path).exists());
    match found {
        Some(path) => Ok(path),
        None => {
            bail!("the clock fault needs libfaketime: `apt-get install faketime`, or set STILE_LIBFAKETIME to libfaketimeMT.so.1")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skew_parses_and_jumps_at_equal_shares_of_the_run() {
        let skew = ClockSkew::parse("+7200:-7200:0").unwrap();
        assert_eq!(skew.offsets_s, [7200, -7200, 0]);
        let jumps: Vec<(Duration, i64)> = skew.jumps(Duration::from_secs(30)).collect();
        assert_eq!(jumps, [(Duration::from_secs(10), -7200), (Duration::from_secs(20), 0)]);
        assert_eq!(ClockSkew::parse("-150").unwrap().jumps(Duration::from_secs(30)).count(), 0);
        assert!(ClockSkew::parse("+1h").is_err());
    }
}
