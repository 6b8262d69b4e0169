//! Shared helpers for Tandem's benchmarks.

/// Resident set size of this process, in bytes (Linux).
pub fn rss_bytes() -> u64 {
    vm_rss("/proc/self/status")
}

/// VmRSS of a `/proc/<pid>/status` file, in bytes.
fn vm_rss(path: &str) -> u64 {
    let status = std::fs::read_to_string(path).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The `tandem` binary the benchmarks drive: $TANDEM_BIN, else this workspace's release build.
pub fn tandem_bin() -> std::path::PathBuf {
    std::env::var_os("TANDEM_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/tandem")
        })
}

/// Runs a tandem CLI command to completion (its stderr shown); returns its stdout.
pub fn tandem(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(tandem_bin())
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "tandem {} failed", args.join(" "));
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// A `tandem controller` (or other long-running) child process, killed when dropped.
pub struct Controller(pub std::process::Child);

impl Controller {
    /// Its resident set size, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        vm_rss(&format!("/proc/{}/status", self.0.id()))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
