//! The flags every command takes, kubectl style (`--kubeconfig`, `--context`, `-n`, `-o`),
//! accepted before or after the verb, and the one parser of duration flags.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;

/// Which cluster a command talks to, as kubectl takes it.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file [default: $KUBECONFIG or ~/.kube/config].
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
}

/// The flags of every command, defined once on the top-level parser.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct GlobalArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The namespace, for commands that act on one (`offload`, `unoffload`, `export`, `unexport`).
    #[arg(short = 'n', long, value_name = "NAME", global = true)]
    pub namespace: Option<String>,
    /// Output format, for commands that print objects (`status`, `discover`, `lab status`) [default: table].
    #[arg(short = 'o', long, value_enum, global = true)]
    pub output: Option<Output>,
}

/// How a command prints what it reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns sized to their contents.
    #[default]
    Table,
    Json,
    Yaml,
}

impl GlobalArgs {
    /// The namespace a command acts on: its positional argument or `-n`, which must agree.
    pub fn namespace_or(&self, positional: Option<String>) -> Result<String, Error> {
        match (positional, self.namespace.clone()) {
            (Some(p), Some(f)) if p != f => Err(Error::NamespaceConflict {
                positional: p,
                flag: f,
            }),
            (Some(ns), _) | (None, Some(ns)) => Ok(ns),
            (None, None) => Err(Error::NoNamespace),
        }
    }
}

/// Parses a duration flag ("90s", "2m", "1h30m", "2d"; humantime's grammar); zero is refused
/// because every duration flag is a wait or a validity.
pub fn duration(s: &str) -> Result<Duration, Error> {
    let d = humantime::parse_duration(s).map_err(|source| Error::Duration {
        input: s.to_string(),
        source,
    })?;
    if d.is_zero() {
        return Err(Error::ZeroDuration(s.to_string()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_humantime_and_refuse_zero_and_bare_numbers() {
        for (s, want) in [
            ("90s", Some(90)),
            ("2m", Some(120)),
            ("1h30m", Some(5400)),
            ("1h 30m", Some(5400)),
            ("2d", Some(172800)),
            ("1", None),
            ("x", None),
            ("soon", None),
            ("0s", None),
        ] {
            assert_eq!(duration(s).ok().map(|d| d.as_secs()), want, "{s}");
        }
    }

    #[test]
    fn the_namespace_comes_from_the_argument_or_n_and_they_must_agree() {
        let flag = |n: Option<&str>| GlobalArgs {
            namespace: n.map(str::to_string),
            ..Default::default()
        };
        let arg = |s: &str| Some(s.to_string());
        assert_eq!(flag(None).namespace_or(arg("shop")).unwrap(), "shop");
        assert_eq!(flag(Some("shop")).namespace_or(None).unwrap(), "shop");
        assert_eq!(
            flag(Some("shop")).namespace_or(arg("shop")).unwrap(),
            "shop"
        );
        assert!(matches!(
            flag(Some("web")).namespace_or(arg("shop")),
            Err(Error::NamespaceConflict { .. })
        ));
        assert!(matches!(
            flag(None).namespace_or(None),
            Err(Error::NoNamespace)
        ));
    }
}
