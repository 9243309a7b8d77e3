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

/// CPU seconds used so far by every PostgreSQL server process, those that
/// have exited included: a backend's time passes to the postmaster's reaped
/// children when it ends, so the postmasters' children's time counts too.
/// For workloads whose backends come and go (pgbench's).
pub fn postgres_cpu_seconds() -> f64 {
    let pids = postgres_pids();
    let live = cpu_seconds(&pids);
    let reaped: u64 = pids.iter().filter(|&&pid| is_postmaster(pid)).map(|&pid| stat_fields(pid, &[13, 14])).sum();
    live + reaped as f64 / 100.0
}

/// Context switches on the whole machine since boot (`ctxt` of `/proc/stat`).
pub fn context_switches() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines().find_map(|line| line.strip_prefix("ctxt ")?.trim().parse().ok()).unwrap_or(0)
}

fn ticks(pid: i32) -> u64 {
    stat_fields(pid, &[11, 12])
}

/// The sum of fields of `/proc/<pid>/stat`, counted from the first after the
/// parenthesised command name (utime and stime, fields 14 and 15 of the
/// whole line, are 11 and 12; cutime and cstime 13 and 14).
fn stat_fields(pid: i32, which: &[usize]) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    which.iter().map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0)).sum()
}

/// A postmaster: a postgres process whose parent is not one.
fn is_postmaster(pid: i32) -> bool {
    let parent = stat_fields(pid, &[1]);
    let parent = i32::try_from(parent).unwrap_or(0);
    std::fs::read_to_string(format!("/proc/{parent}/comm")).map_or(true, |comm| comm.trim() != "postgres")
}
