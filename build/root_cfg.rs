// Included by the build scripts of the crates whose tests need root (network namespaces, TUN,
// nftables, chroot): sets `cfg(tandem_root)` when the build runs as root, so that those tests
// carry `#[cfg_attr(not(tandem_root), ignore = "needs root")]` and a build without root lists
// them as ignored instead of passing them silently. `.ci/run` fails if any test is ignored.
//
// The effective uid is read from /proc (Linux, like every root-only test) rather than through
// a libc crate, to keep build scripts free of dependencies. Rebuilt when the user changes
// (`sudo` sets USER).

fn emit_root_cfg() {
    println!("cargo::rustc-check-cfg=cfg(tandem_root)");
    println!("cargo::rerun-if-env-changed=USER");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../../build/root_cfg.rs");
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // "Uid:\t<real>\t<effective>\t<saved>\t<fs>"
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1));
    if effective == Some("0") {
        println!("cargo::rustc-cfg=tandem_root");
    }
}
