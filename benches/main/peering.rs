//! `cargo bench -p tandem-benches --bench peering` runs [`tandem_benches::peering`] (what it
//! measures is documented there). Its code lives in the library so that CI's one build of the
//! workspace lints it (`.ci/run`); this file only picks the allocator and calls it.

// The same allocator as the `tandem` binary, whose processes this benchmark runs beside.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    tandem_benches::peering::main()
}
