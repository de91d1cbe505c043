//! Where a loaded machine's CPU goes, from `/proc`: all of it, this process, and PostgreSQL's
//! processes. On a machine the load saturates, throughput follows the CPU every part of a request
//! costs, the database's included, not only the gateway's process (issue 35).

use std::time::Duration;

/// CPU used since boot, in clock ticks of 10 ms.
#[derive(Clone, Copy, Default)]
pub struct Ticks {
    /// Every core's busy time (user, nice, system, irq, softirq, steal).
    pub machine: u64,
    /// This process (threads and reaped children included).
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
            let Some(stat) = std::fs::read_to_string(entry.path().join("stat")).ok() else {
                continue;
            };
            if stat.contains("(postgres)") || stat.contains("(postgres:") {
                postgres += process_ticks(&stat);
            }
        }
        let this = process_ticks(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default());
        Ticks {
            machine,
            this,
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
        let us = |t: u64| Duration::from_millis(t * 10).as_secs_f64() * 1e6 / n.max(1) as f64;
        let (m, t, p) = (us(self.machine), us(self.this), us(self.postgres));
        (m, t, p, m - t - p)
    }
}

/// utime + stime + cutime + cstime of one `/proc/<pid>/stat` line.
fn process_ticks(stat: &str) -> u64 {
    let after = stat.rsplit(')').next().unwrap_or("");
    after
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|x| x.parse::<u64>().ok())
        .sum()
}
