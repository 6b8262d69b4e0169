//! `tandem crds`: print (or write) the CustomResourceDefinitions generated from crates/api.

use std::path::PathBuf;

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
            std::fs::create_dir_all(&dir)?;
            for crd in tandem_api::crds::all() {
                let path = dir.join(tandem_api::crds::file_name(&crd));
                std::fs::write(&path, tandem_api::crds::to_yaml(&crd))
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
