//! CPU time from `/proc`: a process's, and where a loaded machine's goes (all of it, this
//! process, PostgreSQL's processes). On a machine the load saturates, throughput follows the CPU
//! every part of a request costs, the database's included, not only the gateway's process (issue
//! 35).

use std::time::Duration;

/// CPU used since boot, in clock ticks of 10 ms.
#[derive(Clone, Copy, Default)]
pub struct Ticks {
    /// Every core's busy time (user, nice, system, irq, softirq, steal).
    pub machine: u64,
    /// This process (user + system, every thread).
    pub this: u64,
    /// The PostgreSQL server's processes (backends that exited are in the postmaster's
    /// reaped-children counts).
    pub postgres: u64,
}

impl Ticks {
    pub fn now() -> Ticks {
        let machine = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let cpu = s.lines().next()?.split_whitespace().skip(1);
                let v: Vec<u64> = cpu.filter_map(|x| x.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal
                Some(v.iter().take(8).sum::<u64>() - v.get(3)? - v.get(4)?)
            })
            .unwrap_or(0);
        let mut postgres = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if comm(&stat) == "postgres" {
                postgres += ticks(&stat, true);
            }
        }
        Ticks {
            machine,
            this: stat_ticks("self"),
            postgres,
        }
    }

    pub fn since(self, before: Ticks) -> Ticks {
        Ticks {
            machine: self.machine.saturating_sub(before.machine),
            this: self.this.saturating_sub(before.this),
            postgres: self.postgres.saturating_sub(before.postgres),
        }
    }

    pub fn add(self, other: Ticks) -> Ticks {
        Ticks {
            machine: self.machine + other.machine,
            this: self.this + other.this,
            postgres: self.postgres + other.postgres,
        }
    }

    /// (machine, this process, PostgreSQL, the rest) in microseconds per `n`.
    pub fn per(&self, n: u64) -> (f64, f64, f64, f64) {
        let us = |t: u64| as_duration(t).as_secs_f64() * 1e6 / n.max(1) as f64;
        let (m, t, p) = (us(self.machine), us(self.this), us(self.postgres));
        (m, t, p, m - t - p)
    }
}

/// CPU time (user + system) of process `pid`.
pub fn cpu_of(pid: u32) -> Duration {
    as_duration(stat_ticks(&pid.to_string()))
}

/// Clock ticks as time (100 a second on Linux).
pub fn as_duration(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 10)
}

/// User + system ticks of `/proc/<pid>/stat` (`pid` may be `self`).
fn stat_ticks(pid: &str) -> u64 {
    ticks(
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default(),
        false,
    )
}

/// The command name of a `/proc/<pid>/stat` line.
fn comm(stat: &str) -> &str {
    let start = stat.find('(').map_or(0, |i| i + 1);
    let end = stat.rfind(')').unwrap_or(start).max(start);
    &stat[start..end]
}

/// utime + stime of a `/proc/<pid>/stat` line, with its reaped children's (cutime + cstime)
/// when `children`.
fn ticks(stat: &str, children: bool) -> u64 {
    let after = stat.rsplit(')').next().unwrap_or("");
    after
        .split_whitespace()
        .skip(11)
        .take(if children { 4 } else { 2 })
        .filter_map(|x| x.parse::<u64>().ok())
        .sum()
}
