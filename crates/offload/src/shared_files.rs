//! A directory sandboxes and clients share files in (a lease's, the blob store), and reading
//! and writing its files for a client: by plain names only, never following a link a
//! sandbox left nor opening anything but a regular file, each write whole or not at all
//! (the HTTP edge streams bodies through [`SharedDir::upload`] and [`SharedDir::open`]).

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sprout_engine::{Error, ErrorCode};

/// Longest name of a shared file.
const MAX_NAME: usize = 128;

/// A directory of shared files; what a client writes there is owned by `owner`.
pub struct SharedDir {
    path: PathBuf,
    owner: (u32, u32),
}

impl SharedDir {
    pub fn new(path: PathBuf, owner: (u32, u32)) -> SharedDir {
        SharedDir { path, owner }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open file `name` to read: a regular file, not reached through a link.
    pub fn open(&self, name: &str) -> io::Result<(fs::File, u64)> {
        check_name(name)?;
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK) // a FIFO left there must not block us
            .open(self.path.join(name))?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a regular file")));
        }
        Ok((file, meta.len()))
    }

    /// Remove file `name` (a link is removed, not followed).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        fs::remove_file(self.path.join(name))
    }

    /// Begin writing file `name` (replacing one there when finished): written to a hidden
    /// file first, renamed into place by [`Upload::finish`], removed if the upload is
    /// dropped unfinished.
    pub fn upload(&self, name: &str) -> io::Result<Upload> {
        check_name(name)?;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.path.join(format!(".{name}.{seq}.upload"));
        let file = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(&tmp)?;
        let (uid, gid) = self.owner;
        let owned = nix::unistd::fchown(std::os::fd::AsRawFd::as_raw_fd(&file), Some(uid.into()), Some(gid.into()));
        let upload = Upload { file: Some(file), tmp, path: self.path.join(name) };
        owned?;
        Ok(upload)
    }

    /// Write `data` as file `name` at once.
    #[cfg(test)]
    pub fn write(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut upload = self.upload(name)?;
        io::Write::write_all(upload.file(), data)?;
        upload.finish()
    }
}

/// Make `path` afresh (removing what was there) with `mode`, root's.
pub fn fresh_dir(path: &Path, mode: u32) -> io::Result<()> {
    if path.exists() {
        fs::remove_dir_all(path)?;
    }
    fs::create_dir(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)) // (umask aside: 1733 for the blobs)
}

/// A file being written into a shared directory.
pub struct Upload {
    file: Option<fs::File>,
    tmp: PathBuf,
    path: PathBuf,
}

impl Upload {
    pub fn file(&mut self) -> &mut fs::File {
        self.file.as_mut().expect("an upload not finished")
    }

    /// Put the file in place (replacing one there).
    pub fn finish(mut self) -> io::Result<()> {
        drop(self.file.take());
        fs::rename(&self.tmp, &self.path)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.file.is_some() || self.tmp.exists() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// A shared file's name: 1 to 128 of ASCII letters, digits, `.`, `_` and `-`, not starting
/// with `.`.
pub fn check_name(name: &str) -> io::Result<()> {
    let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if name.is_empty() || name.len() > MAX_NAME || name.starts_with('.') || !plain {
        let why = format!("a file's name is 1 to {MAX_NAME} ASCII letters, digits, '.', '_' and '-', not starting with '.': {name:?}");
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    Ok(())
}

/// A file's error as the API's: 404 `not_found`, 400 `invalid_request` (a bad name, not a
/// regular file), else 500.
pub fn file_error(e: io::Error) -> Error {
    let code = match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::InvalidInput => ErrorCode::InvalidRequest,
        _ => ErrorCode::Internal,
    };
    Error::new(code, format!("the file: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_plain_and_never_hidden_nor_paths() {
        for good in ["t0_1.npy", "a", "A-b.c", &"x".repeat(128)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".hidden", "..", "a/b", "../x", "a b", "é", &"x".repeat(129), "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_are_written_whole_read_plainly_and_links_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let owner = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let dir = SharedDir::new(root.path().to_path_buf(), owner);
        dir.write("t.npy", b"tile").unwrap();
        let (mut file, len) = dir.open("t.npy").unwrap();
        let mut read = String::new();
        io::Read::read_to_string(&mut file, &mut read).unwrap();
        assert_eq!((read.as_str(), len), ("tile", 4));
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("link")).unwrap();
        assert!(dir.open("link").is_err(), "a link is never followed");
        fs::create_dir(root.path().join("sub")).unwrap();
        assert!(dir.open("sub").is_err(), "only regular files are read");
        assert_eq!(dir.open("missing").unwrap_err().kind(), io::ErrorKind::NotFound);
        let mut unfinished = dir.upload("u.npy").unwrap();
        io::Write::write_all(unfinished.file(), b"half").unwrap();
        drop(unfinished);
        let mut names: Vec<_> = fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["link", "sub", "t.npy"], "an upload dropped unfinished leaves nothing");
        dir.remove("link").unwrap();
        assert!(fs::metadata("/etc/passwd").is_ok() && !root.path().join("link").exists(), "the link went, not its target");
    }
}
