//! `phalanxd bench --profile`: the CPU time the load generator and each replica process
//! spent over the measured window, user and system apart, from `/proc/<pid>/stat` — so a
//! figure comes with where its CPU went (on a pinned core, the processes share it).

use std::time::Instant;

/// One process's CPU time so far, in clock ticks: (user, system).
fn times(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime), counted from the state (field 3).
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// The processes watched, by name, and their CPU times at one moment.
pub(super) struct CpuSample {
    at: Instant,
    times: Vec<(String, Option<(u64, u64)>)>,
}

impl CpuSample {
    pub(super) fn take(procs: &[(String, u32)]) -> Self {
        CpuSample { at: Instant::now(), times: procs.iter().map(|(name, pid)| (name.clone(), times(*pid))).collect() }
    }

    /// The report's lines: each process's user and system seconds from `self` to `later`,
    /// and its share of one core.
    pub(super) fn split(&self, later: &CpuSample) -> Vec<String> {
        // SAFETY: sysconf reads a constant of the system and has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let mut total = (0.0, 0.0);
        let mut lines = vec![format!("cpu         over {wall:.1} s measured: user, system, share of one core")];
        for ((name, before), (_, after)) in self.times.iter().zip(&later.times) {
            let line = match before.zip(*after) {
                Some(((u0, s0), (u1, s1))) => {
                    let (user, system) = (u1.saturating_sub(u0) as f64 / ticks, s1.saturating_sub(s0) as f64 / ticks);
                    total = (total.0 + user, total.1 + system);
                    format!("{user:.2} s  {system:.2} s  {:>4.0}%", 100.0 * (user + system) / wall)
                }
                None => "not readable (the process ended?)".into(),
            };
            lines.push(format!("  {name:<15} {line}"));
        }
        let (user, system) = total;
        lines.push(format!("  {:<15} {user:.2} s  {system:.2} s  {:>4.0}%", "all", 100.0 * (user + system) / wall));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_spends_user_time() {
        let me = [("me".to_string(), std::process::id())];
        let before = CpuSample::take(&me);
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed().as_millis() < 100 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = CpuSample::take(&me);
        let (u0, _) = before.times[0].1.unwrap();
        let (u1, _) = after.times[0].1.unwrap();
        assert!(u1 > u0, "{u0} -> {u1}");
        let lines = before.split(&after);
        assert!(lines[1].trim_start().starts_with("me") && lines[2].trim_start().starts_with("all"), "{lines:?}");
    }
}
