//! `cargo bench -p tandem-benches --bench discovery` runs [`tandem_benches::discovery`] (what it
//! measures is documented there). Its code lives in the library so that CI's one build of the
//! workspace lints it (`.ci/run`); this file only calls it.

fn main() -> anyhow::Result<()> {
    tandem_benches::discovery::main()
}
