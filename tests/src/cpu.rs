//! CPU time of processes, from `/proc` (Linux), for benchmarks that charge a
//! workload's cost to the processes that paid it.

/// CPU seconds (user + system) the processes have used so far, from
/// `/proc/<pid>/stat` (in USER_HZ = 100 ticks per second). A process that is
/// gone counts nothing.
pub fn cpu_seconds(pids: &[i32]) -> f64 {
    pids.iter().map(|&pid| ticks(pid) as f64 / 100.0).sum()
}

/// Every PostgreSQL server process on this machine: the postmaster, its
/// backends and its background workers (the WAL writer, the checkpointer).
pub fn postgres_pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres"))
        .collect()
}

/// Context switches on the whole machine since boot (`ctxt` of `/proc/stat`).
pub fn context_switches() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines().find_map(|line| line.strip_prefix("ctxt ")?.trim().parse().ok()).unwrap_or(0)
}

fn ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}
