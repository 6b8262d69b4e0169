//! `tandem crds`: print (or write) the CustomResourceDefinitions generated from crates/api.

use std::path::PathBuf;

use anyhow::Context as _;

/// Print Tandem's CustomResourceDefinitions as YAML (pipe to `kubectl apply -f -`).
#[derive(clap::Args)]
pub struct Args {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.output_dir {
        None => print!("{}", tandem_api::crds::all_yaml()),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in tandem_api::crds::all() {
                let path = dir.join(tandem_api::crds::file_name(&crd));
                std::fs::write(&path, tandem_api::crds::to_yaml(&crd))
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
