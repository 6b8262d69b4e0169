//! The `tandem` binary.

// The API server and the controllers allocate heavily (JSON trees per request and per watch
// event); glibc's malloc spent over half of a lab API server's CPU in a 10,000-pod burst
// (free-list scans, consolidation). mimalloc is made for this pattern.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tandem_cli::main()
}
