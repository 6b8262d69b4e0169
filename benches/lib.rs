//! Tandem's benchmarks, one module each (`cargo bench -p tandem-benches --bench <module>`
//! runs its `main`; results in `benches/README.md`), and the helpers they share.

pub mod apiserver;
pub mod discovery;
pub mod failover;
pub mod lab;
pub mod mcs;
pub mod network;
pub mod offload;
pub mod peering;
pub mod stages;
pub mod virtual_kubelet;

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
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/x86_64-unknown-linux-gnu/release/tandem")
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

    /// Its CPU time so far (user and system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        process_ticks(&format!("/proc/{}/stat", self.0.id()))
    }
}

/// This process's CPU time so far (user and system), in clock ticks.
pub fn own_cpu_ticks() -> u64 {
    process_ticks("/proc/self/stat")
}

/// utime + stime of a `/proc/<pid>/stat` file (fields 14 and 15), in clock ticks.
fn process_ticks(path: &str) -> u64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The command name (field 2) may hold spaces; fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A lab cluster of a benchmark, with Tandem installed and its controller running.
pub struct Site {
    pub cluster: tandem_lab::LabCluster,
    /// Its admin kubeconfig (a file in the benchmark's directory).
    pub kubeconfig: String,
    /// `tandem controller` against it, with the default timings.
    pub controller: Controller,
}

/// Starts a hollow lab cluster per `(name, region, nodes)` in this process, writes its admin
/// kubeconfig into `dir`, installs Tandem with cluster ID `name` (pod CIDR 10.244.0.0/16) and
/// starts its controller as a `tandem controller` process.
pub async fn sites(
    dir: &std::path::Path,
    specs: &[(&str, &str, usize)],
) -> anyhow::Result<Vec<Site>> {
    let mut sites = Vec::new();
    for &(name, region, nodes) in specs {
        let cluster = tandem_lab::LabCluster::start(tandem_lab::LabConfig {
            name: name.into(),
            nodes,
            region: region.into(),
            ..Default::default()
        })
        .await?;
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, cluster.server.admin_kubeconfig()?)?;
        let kubeconfig = path.display().to_string();
        tandem(&[
            "install",
            "--kubeconfig",
            &kubeconfig,
            "--cluster-id",
            name,
            "--pod-cidr",
            "10.244.0.0/16",
        ])?;
        // BENCH_CONTROLLER_LOGS=DIR keeps each controller's log as DIR/<name>.log.
        let log = match std::env::var_os("BENCH_CONTROLLER_LOGS") {
            Some(logs) => {
                std::fs::File::create(std::path::Path::new(&logs).join(format!("{name}.log")))?
                    .into()
            }
            None => std::process::Stdio::null(),
        };
        let controller = std::process::Command::new(tandem_bin())
            .args(["controller", "--kubeconfig", &kubeconfig])
            .stderr(log)
            .spawn()
            .map(Controller)?;
        sites.push(Site {
            cluster,
            kubeconfig,
            controller,
        });
    }
    Ok(sites)
}
