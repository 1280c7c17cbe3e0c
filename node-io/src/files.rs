//! Files replaced whole: a reader sees the old file or the new one, never a partial one
//! (and, for files no one reads before their writer returns, new ones written in place).

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `contents` to `path` so that readers see the old file or the new one, never a
/// partial one, also across a crash: a hidden `.<name>.<random>.tmp` file in the same
/// directory, fsync, rename over `path`, fsync the directory. The directory must exist.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    replace_file(path, contents, mode, true)
}

/// Like [`write_atomically`], without the fsyncs: readers see the old file or the new one,
/// but a crash may lose the new one. For files whose content is recorded durably elsewhere
/// and written again from there: CDI specs, whose content the checkpoint records and a
/// prepare after a reboot rewrites (and which usually live on a tmpfs, `/var/run/cdi`, that a
/// reboot empties anyway). The `.tmp` suffix keeps CDI registries from reading the
/// unfinished file.
pub fn write_replacing(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    replace_file(path, contents, mode, false)
}

/// Writes a new file `path` in place, or replaces it as [`write_replacing`] does when it
/// exists. For files no one opens before the writer has returned, such as a claim's device
/// metadata, which containers read once the prepare is done (upstream's helper writes them
/// with `os.WriteFile`): a new file then needs no temporary file and rename, which on the
/// kubelet's path are a directory entry made and moved per claim. A crash can leave a new
/// file partial; the next write for it finds it there and replaces it whole.
pub fn write_new_or_replacing(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return write_replacing(path, contents, mode);
        }
        Err(e) => return Err(e),
    };
    // Set explicitly: the mode given at creation is subject to the umask.
    let written = (file.set_permissions(Permissions::from_mode(mode)))
        .and_then(|()| file.write_all(contents));
    if written.is_err() {
        // Not left for a reader to find half written.
        let _ = std::fs::remove_file(path);
    }
    written
}

fn replace_file(path: &Path, contents: &[u8], mode: u32, durable: bool) -> io::Result<()> {
    let dir = parent(path).unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut temp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    // Set explicitly: the mode given at creation is subject to the umask.
    temp.as_file()
        .set_permissions(Permissions::from_mode(mode))?;
    temp.write_all(contents)?;
    if durable {
        temp.as_file().sync_all()?;
    }
    temp.persist(path).map_err(|e| e.error)?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The directory of `path`, `None` for a bare file name (the current directory).
fn parent(path: &Path) -> Option<&Path> {
    path.parent().filter(|dir| !dir.as_os_str().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_no_temporary_file_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomically(&path, b"one", 0o600).unwrap();
        write_replacing(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "the mode given, not the umask's");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"], "no temporary file is left");
    }

    #[test]
    fn a_new_file_is_written_in_place_and_an_existing_one_replaced() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        write_new_or_replacing(&path, b"half writ", 0o644).unwrap();
        let first = std::fs::metadata(&path).unwrap();
        assert_eq!(
            first.mode() & 0o777,
            0o644,
            "the mode given, not the umask's"
        );
        // Found there (say a crash left it partial): replaced whole, as a new inode, so
        // that a reader holding the old file never sees it change under it.
        write_new_or_replacing(&path, b"whole", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        let second = std::fs::metadata(&path).unwrap();
        assert_ne!(
            first.ino(),
            second.ino(),
            "an existing file is replaced, not rewritten"
        );
        assert_eq!(second.mode() & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["metadata.json"], "no temporary file is left");
    }
}
