//! Directories Tandem keeps its lab and demo clusters in: Tandem marks each one it creates, and
//! only ever clears or writes into a directory it made, so `--dir ~/work` can never destroy a
//! user's files.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// The file Tandem writes into every directory it creates.
pub const MARKER: &str = ".tandem-lab";

const MARKER_TEXT: &str = "This directory was created by Tandem (`tandem lab up` / `tandem demo`) for its clusters' data.\n\
`tandem demo` clears it on start; delete it when you no longer need the clusters.\n";

/// What a command wants of its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Start from an empty directory (`tandem demo`).
    Fresh,
    /// Keep what an earlier run left (`tandem lab up` restarts with every object).
    Keep,
}

/// What the directory holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Missing,
    Empty,
    /// It has Tandem's marker, or it is Tandem's default directory under `~/.tandem/` (which
    /// older versions left without a marker).
    Tandems,
    /// Anything else: files Tandem did not put there, or not a directory at all.
    Foreign,
}

/// What to do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Create it (or use the empty one) and mark it.
    Create,
    /// Remove it with everything in it, then create and mark it.
    Clear,
    /// Use it as it is, marking it if an older version left it unmarked.
    Reuse,
    Refuse,
}

fn decide(found: Found, usage: Use) -> Step {
    match (found, usage) {
        (Found::Missing | Found::Empty, _) => Step::Create,
        (Found::Tandems, Use::Fresh) => Step::Clear,
        (Found::Tandems, Use::Keep) => Step::Reuse,
        (Found::Foreign, _) => Step::Refuse,
    }
}

/// Makes `dir` ready for a command's clusters; `default` is the command's own default directory
/// under `~/.tandem/`. Refuses a directory Tandem did not create.
pub fn claim(dir: &Path, default: &Path, usage: Use) -> Result<(), Error> {
    let found = if !dir.exists() {
        Found::Missing
    } else if dir.join(MARKER).is_file() || (dir.is_dir() && same(dir, default)) {
        Found::Tandems
    } else if dir.is_dir()
        && std::fs::read_dir(dir)
            .map_err(io("reading", dir))?
            .next()
            .is_none()
    {
        Found::Empty
    } else {
        Found::Foreign
    };
    match decide(found, usage) {
        Step::Refuse => {
            return Err(Error::ForeignDirectory {
                dir: dir.to_path_buf(),
                marker: MARKER,
            });
        }
        Step::Clear => std::fs::remove_dir_all(dir).map_err(io("clearing", dir))?,
        Step::Create | Step::Reuse => {}
    }
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    // It holds the kubeconfig with the clusters' admin credentials, and the clusters' data:
    // private to the user who runs the lab (pods of a network-mode lab run as other users).
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(io("restricting", dir))?;
    let marker = dir.join(MARKER);
    std::fs::write(&marker, MARKER_TEXT).map_err(io("writing", &marker))
}

/// Writes the clusters' kubeconfig as `dir/kubeconfig` atomically (a reader — a test, kubectl —
/// never sees half a file) and returns its path.
pub fn write_kubeconfig(dir: &Path, yaml: &str) -> Result<PathBuf, Error> {
    let path = dir.join("kubeconfig");
    tandem_apiserver::fsutil::write_atomic(&path, yaml.as_bytes()).map_err(io("writing", &path))?;
    Ok(path)
}

/// The error of file-system step `step` on `path`.
fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { step, path, source }
}

/// Whether two paths name the same directory (either may be spelled differently).
fn same(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    canonical(a) == canonical(b)
}

/// `~/.tandem/<name>`: the default directory of `tandem lab` (`lab`) and `tandem demo` (`demo`).
pub fn default_dir(name: &str) -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".tandem")
        .join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_directory_tandem_made_is_ever_cleared_or_reused() {
        for (found, usage, want) in [
            (Found::Missing, Use::Fresh, Step::Create),
            (Found::Missing, Use::Keep, Step::Create),
            (Found::Empty, Use::Fresh, Step::Create),
            (Found::Empty, Use::Keep, Step::Create),
            (Found::Tandems, Use::Fresh, Step::Clear),
            (Found::Tandems, Use::Keep, Step::Reuse),
            (Found::Foreign, Use::Fresh, Step::Refuse),
            (Found::Foreign, Use::Keep, Step::Refuse),
        ] {
            assert_eq!(decide(found, usage), want, "{found:?} {usage:?}");
        }
    }

    #[test]
    fn a_foreign_directory_is_refused_untouched_and_a_marked_one_cleared() {
        let home = tempfile::tempdir().unwrap();
        let default = home.path().join(".tandem/demo");
        let work = home.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("notes.txt"), "mine").unwrap();
        let err = claim(&work, &default, Use::Fresh).unwrap_err();
        assert!(matches!(err, Error::ForeignDirectory { .. }), "{err}");
        assert!(err.to_string().contains(&work.display().to_string()));
        assert_eq!(
            std::fs::read_to_string(work.join("notes.txt")).unwrap(),
            "mine"
        );
        assert!(!work.join(MARKER).exists());

        // The default directory an older version left unmarked is Tandem's: cleared and marked.
        std::fs::create_dir_all(default.join("lab-1")).unwrap();
        claim(&default, &default, Use::Fresh).unwrap();
        assert!(!default.join("lab-1").exists() && default.join(MARKER).is_file());
        // A marked directory is kept for `lab up`.
        std::fs::create_dir_all(default.join("lab-1")).unwrap();
        claim(&default, &default, Use::Keep).unwrap();
        assert!(default.join("lab-1").exists());
    }
}
