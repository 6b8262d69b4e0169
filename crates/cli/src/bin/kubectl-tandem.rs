//! `kubectl-tandem`: the same command line as `tandem`, found by kubectl as the plugin
//! `kubectl tandem …` when it is on the PATH.

fn main() -> std::process::ExitCode {
    tandem_cli::main()
}
