//! The `tandem` binary.

fn main() -> std::process::ExitCode {
    tandem_cli::main()
}
