//! `cargo bench -p tandem-benches --bench network` runs [`tandem_benches::network`] (what it
//! measures is documented there). Its code lives in the library so that CI's one build of the
//! workspace lints it (`.ci/run`); this file only calls it.

fn main() -> anyhow::Result<()> {
    tandem_benches::network::main()
}
