//! What a lab container and node use, for the kubelet's resource metrics
//! ([`super::kubelet_metrics`]):
//!
//! - A container of Tandem's image runs a real process: its CPU is the process's `utime +
//!   stime + cutime + cstime` from `/proc/PID/stat` in clock ticks (`sysconf(CLK_TCK)`), its
//!   working set the process's `VmRSS` from `/proc/PID/status` (a cgroup's working set is its
//!   usage less inactive file pages; a lone process's resident set is the nearest measure).
//!   Between a process's exit and its restart the container has no sample.
//! - A container running a built-in program (echo, probe) is a few tasks inside the lab
//!   process, which no counter separates from the rest of it. It reports a constant working
//!   set of [`BUILTIN_WORKING_SET`] and a constant [`BUILTIN_CPU_SECONDS`] of CPU (the cost of
//!   starting a small process): its CPU rate is zero, which is what the lab knows. The CPU
//!   is not zero because metrics-server treats a zero counter as a missing one.
//! - A hollow container (any other image) runs nothing and has no sample, as kubelet has none
//!   for a container without stats.
//!
//! A node's usage is its share of the lab process (the API server, the kubelets and the
//! built-in programs all run in it: its own CPU time and resident set divided equally among
//! the cluster's nodes), plus the real processes of the pods on the node. Every read is a few
//! small files under /proc, made when the endpoint is asked.

use std::sync::Arc;

use parking_lot::Mutex;

/// The working set a built-in program's container reports, in bytes.
pub const BUILTIN_WORKING_SET: u64 = 2 * 1024 * 1024;

/// The cumulative CPU a built-in program's container reports, in core-seconds.
pub const BUILTIN_CPU_SECONDS: f64 = 0.01;

/// What one container of a lab pod runs, for its usage: shared with the supervisor of its
/// process, which records each start and exit.
#[derive(Clone)]
pub struct ContainerUsage(Arc<Mutex<Runs>>);

enum Runs {
    /// A built-in program, started at (seconds since the epoch).
    Builtin(f64),
    /// A real process: its pid and start (seconds since the epoch) while it runs.
    Process(Option<(u32, f64)>),
}

fn now_seconds() -> f64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond() as f64 / 1000.0
}

impl ContainerUsage {
    /// A container running a built-in program, started now.
    pub fn builtin() -> ContainerUsage {
        ContainerUsage(Arc::new(Mutex::new(Runs::Builtin(now_seconds()))))
    }

    /// A container whose real process has not started yet.
    pub fn process() -> ContainerUsage {
        ContainerUsage(Arc::new(Mutex::new(Runs::Process(None))))
    }

    /// The container's process `pid` started now.
    pub fn started(&self, pid: u32) {
        *self.0.lock() = Runs::Process(Some((pid, now_seconds())));
    }

    /// The container's process exited.
    pub fn exited(&self) {
        *self.0.lock() = Runs::Process(None);
    }

    /// Whether the container runs a real process (or waits to).
    pub(super) fn is_process(&self) -> bool {
        matches!(*self.0.lock(), Runs::Process(_))
    }

    /// What the container uses now; None while no process runs or it cannot be read.
    pub(super) fn read(&self, ticks: f64) -> Option<(f64, u64, f64)> {
        match *self.0.lock() {
            Runs::Builtin(start) => Some((BUILTIN_CPU_SECONDS, BUILTIN_WORKING_SET, start)),
            Runs::Process(Some((pid, start))) => {
                let (cpu, memory) = process_usage(&pid.to_string(), ticks)?;
                Some((cpu, memory, start))
            }
            Runs::Process(None) => None,
        }
    }
}

/// The containers of one pod whose usage is reported, and the node it runs on.
pub struct PodUsage {
    /// The node the pod runs on.
    pub node: String,
    /// Container name and what it runs, for containers that run something.
    pub containers: Vec<(String, ContainerUsage)>,
}

impl PodUsage {
    /// A pod on `node`, no container yet.
    pub fn new(node: &str) -> PodUsage {
        PodUsage {
            node: node.to_string(),
            containers: Vec::new(),
        }
    }

    /// Reports container `name`'s usage from `usage`.
    pub fn add(&mut self, name: &str, usage: ContainerUsage) {
        self.containers.push((name.to_string(), usage));
    }
}

/// Cumulative CPU (core-seconds) and resident set (bytes) of process `pid` (`self` for this
/// one), from its `stat` and `status` under /proc.
pub(super) fn process_usage(pid: &str, ticks: f64) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((cpu_ticks(&stat)? as f64 / ticks, resident_bytes(&status)?))
}

/// `utime + stime + cutime + cstime` of a `/proc/PID/stat` line (fields 14 to 17; the
/// command name before them is in parentheses and may hold spaces or parentheses itself).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().ok())
        .sum()
}

/// `VmRSS` of a `/proc/PID/status`, in bytes.
fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Clock ticks per second, for /proc's CPU times.
pub(super) fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        // USER_HZ, fixed at 100 by the kernel ABI on every architecture Tandem builds for.
        _ => 100.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_ticks_and_resident_set_from_proc() {
        let stat = "4242 (tandem (lab) x) S 1 4242 4242 0 -1 4194560 1 0 0 0 150 50 7 3 20 0 1 0";
        assert_eq!(cpu_ticks(stat), Some(210));
        assert_eq!(cpu_ticks("4242 (short) S 1"), None);
        let status = "Name:\ttandem\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nThreads:\t4\n";
        assert_eq!(resident_bytes(status), Some(5 * 1024 * 1024));
        let (cpu, rss) = process_usage("self", clock_ticks()).expect("this process is readable");
        assert!(cpu >= 0.0 && rss > 0);
    }

    #[test]
    fn a_process_container_reports_its_process_while_it_runs() {
        let ticks = clock_ticks();
        let usage = ContainerUsage::process();
        assert!(usage.is_process() && usage.read(ticks).is_none());
        usage.started(std::process::id());
        let (cpu, memory, start) = usage.read(ticks).expect("this process is readable");
        assert!(
            cpu >= 0.0 && memory > 0 && start > 1.7e9,
            "{cpu} {memory} {start}"
        );
        usage.exited();
        assert!(usage.read(ticks).is_none());
        let builtin = ContainerUsage::builtin().read(ticks).unwrap();
        assert_eq!(
            (builtin.0, builtin.1),
            (BUILTIN_CPU_SECONDS, BUILTIN_WORKING_SET)
        );
    }
}
