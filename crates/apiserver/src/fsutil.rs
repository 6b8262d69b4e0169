//! File writes that a crash cannot tear.

use std::io::Write;
use std::path::Path;

/// Writes `data` to `path` through a temporary file, fsync and rename, so a reader finds
/// either the old or the new content, never a mix.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
